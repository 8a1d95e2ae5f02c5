#include "planner/manifest.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "backend/registry.h"

namespace kvasir {
namespace {

using nlohmann::json;

// Milliseconds to the microsecond: estimates, not measurements.
double RoundMs(double ms) { return std::round(ms * 1000.0) / 1000.0; }

bool IsHex(const std::string &s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) {
      return false;
    }
  }
  return true;
}

// Typed field access with errors naming the field; exceptions never leave this file.
template <typename T>
Status Get(const json &j, const char *field, T *out) {
  if (!j.is_object() || !j.contains(field)) return Error("missing field '{}'", field);
  const json &v = j.at(field);
  bool ok;
  if constexpr (std::is_same_v<T, bool>) {
    ok = v.is_boolean();
  } else if constexpr (std::is_same_v<T, std::string>) {
    ok = v.is_string();
  } else if constexpr (std::is_same_v<T, double>) {
    ok = v.is_number();
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    ok = v.is_number_unsigned();
  } else {
    ok = v.is_number_integer() && v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
  }
  if (!ok) return Error("field '{}' has the wrong type ({})", field, v.type_name());
  *out = v.get<T>();
  return Status::Ok();
}

Status RankFromJson(const json &j, ManifestRank *r) {
  KV_RETURN_IF_ERROR(Get(j, "rank", &r->rank));
  KV_RETURN_IF_ERROR(Get(j, "device", &r->device));
  if (j.contains("backend")) KV_RETURN_IF_ERROR(Get(j, "backend", &r->backend));
  if (!j.contains("layers") || !j["layers"].is_array() || j["layers"].size() != 2 ||
      !j["layers"][0].is_number_integer() || !j["layers"][1].is_number_integer()) {
    return Error("field 'layers' must be [first, last]");
  }
  int64_t first = j["layers"][0].get<int64_t>(), last = j["layers"][1].get<int64_t>();
  if (first < 0 || last > INT32_MAX || first > last) {
    return Error("layers [{}, {}) is not a window", first, last);
  }
  r->first = int(first);
  r->last = int(last);
  KV_RETURN_IF_ERROR(Get(j, "has_embed", &r->has_embed));
  KV_RETURN_IF_ERROR(Get(j, "has_head", &r->has_head));
  KV_RETURN_IF_ERROR(Get(j, "weight_bytes", &r->weight_bytes));
  KV_RETURN_IF_ERROR(Get(j, "kv_bytes", &r->kv_bytes));
  KV_RETURN_IF_ERROR(Get(j, "ms_per_token", &r->ms_per_token));
  if (j.contains("node_key") && !j["node_key"].is_null()) {
    std::string key;
    KV_RETURN_IF_ERROR(Get(j, "node_key", &key));
    r->node_key = key;
  }
  if (!j.contains("tensors") || !j["tensors"].is_array()) {
    return Error("field 'tensors' must be an array");
  }
  for (const json &t : j["tensors"]) {
    ManifestTensor mt;
    Status s = Get(t, "name", &mt.name);
    if (s.ok() && t.contains("sha256") && !t["sha256"].is_null()) {
      std::string sha;
      s = Get(t, "sha256", &sha);
      mt.sha256 = sha;
    }
    if (!s.ok()) return s.WithContext(fmt::format("tensor {}", r->tensors.size()));
    r->tensors.push_back(std::move(mt));
  }
  return Status::Ok();
}

}  // namespace

Manifest BuildManifest(const ModelCost &cost, const Plan &plan, std::string model_id_hex,
                       std::string model) {
  Manifest m;
  m.model_id = std::move(model_id_hex);
  m.model = std::move(model);
  m.n_layer = plan.n_layer;
  m.ctx = plan.ctx;
  m.ms_per_token = plan.ms_per_token;
  for (size_t i = 0; i < plan.ranks.size(); ++i) {
    const PlannedRank &p = plan.ranks[i];
    ManifestRank r;
    r.rank = int(i);
    r.device = p.device;
    if (!p.backend.empty()) r.backend = p.backend;
    r.first = p.first;
    r.last = p.last;
    r.has_embed = p.has_embed;
    r.has_head = p.has_head;
    r.weight_bytes = p.weight_bytes;
    r.kv_bytes = p.kv_bytes;
    r.ms_per_token = p.ms_per_token();
    for (auto &name : cost.WindowTensors(p.first, p.last)) r.tensors.push_back({name, {}});
    m.ring.push_back(p.device);
    m.ranks.push_back(std::move(r));
  }
  return m;
}

Status ValidateManifest(const Manifest &m) {
  if (m.version != kManifestVersion) {
    return Error("version {} is not supported (this build reads {})", m.version, kManifestVersion);
  }
  if (!IsHex(m.model_id, 32)) return Error("model_id '{}' is not 32 hex digits", m.model_id);
  if (m.n_layer <= 0) return Error("n_layer must be > 0 (got {})", m.n_layer);
  if (m.ctx <= 0) return Error("ctx must be > 0 (got {})", m.ctx);
  if (m.ranks.empty()) return Error("no ranks");
  if (m.ring.size() != m.ranks.size()) {
    return Error("ring lists {} devices for {} ranks", m.ring.size(), m.ranks.size());
  }
  std::set<std::string> devices;
  int next = 0;
  for (size_t i = 0; i < m.ranks.size(); ++i) {
    const ManifestRank &r = m.ranks[i];
    auto fail = [&](const Status &s) { return s.WithContext(fmt::format("rank {}", i)); };
    if (r.rank != int(i))
      return fail(Error("numbered {}, expected {} (ranks in order)", r.rank, i));
    if (r.device.empty()) return fail(Error("empty device name"));
    if (!devices.insert(r.device).second) {
      return fail(Error("device '{}' appears in two ranks", r.device));
    }
    if (m.ring[i] != r.device) {
      return fail(Error("device '{}' but ring[{}] is '{}'", r.device, i, m.ring[i]));
    }
    if (auto spec = ParseBackendSpec(r.backend); !spec.ok()) return fail(spec.status());
    if (r.first >= r.last) return fail(Error("layers [{}, {}) is empty", r.first, r.last));
    if (r.first < next) {
      return fail(Error("layers [{}, {}) overlap the previous rank's, which end at {}", r.first,
                        r.last, next));
    }
    if (r.first > next) {
      return fail(Error("layers [{}, {}) leave a gap: layers [{}, {}) belong to no rank", r.first,
                        r.last, next, r.first));
    }
    if (r.last > m.n_layer) {
      return fail(Error("layers [{}, {}) go past n_layer {}", r.first, r.last, m.n_layer));
    }
    if (r.has_embed != (r.first == 0)) {
      return fail(Error("has_embed is {} but the window starts at layer {}", r.has_embed, r.first));
    }
    if (r.has_head != (r.last == m.n_layer)) {
      return fail(Error("has_head is {} but the window ends at layer {} of {}", r.has_head, r.last,
                        m.n_layer));
    }
    if (r.node_key && !IsHex(*r.node_key, 64)) {
      return fail(Error("node_key '{}' is not 64 hex digits", r.node_key->substr(0, 80)));
    }
    for (const auto &t : r.tensors) {
      if (t.name.empty()) return fail(Error("a tensor has an empty name"));
      if (t.sha256 && !IsHex(*t.sha256, 64)) {
        return fail(Error("tensor {}: sha256 '{}' is not 64 hex digits", t.name, *t.sha256));
      }
    }
    next = r.last;
  }
  if (next != m.n_layer) {
    return Error("layers [{}, {}) belong to no rank (windows must cover [0, {}))", next, m.n_layer,
                 m.n_layer);
  }
  return Status::Ok();
}

Status SetManifestKeys(Manifest *m, const json &keys, const std::string &name) {
  if (!keys.is_object()) {
    return Error("{}: must be a JSON object of device name -> node key (kvasir id)", name);
  }
  for (const auto &[device, key] : keys.items()) {
    if (!key.is_string() || !IsHex(key.get<std::string>(), 64)) {
      return Error("{}: device '{}': the node key must be 64 hex digits (kvasir id prints it)",
                   name, device);
    }
    bool found = false;
    for (auto &r : m->ranks) {
      if (r.device == device) {
        r.node_key = key.get<std::string>();
        found = true;
      }
    }
    (void)found;  // a device the plan leaves out needs no key
  }
  return Status::Ok();
}

json ManifestToJson(const Manifest &m) {
  json ranks = json::array();
  for (const auto &r : m.ranks) {
    json tensors = json::array();
    for (const auto &t : r.tensors) {
      json jt = {{"name", t.name}};
      if (t.sha256) jt["sha256"] = *t.sha256;
      tensors.push_back(std::move(jt));
    }
    ranks.push_back({{"rank", r.rank},
                     {"device", r.device},
                     {"backend", r.backend},
                     {"layers", {r.first, r.last}},
                     {"has_embed", r.has_embed},
                     {"has_head", r.has_head},
                     {"weight_bytes", r.weight_bytes},
                     {"kv_bytes", r.kv_bytes},
                     {"ms_per_token", RoundMs(r.ms_per_token)},
                     {"tensors", std::move(tensors)}});
    if (r.node_key) ranks.back()["node_key"] = *r.node_key;
  }
  return json{{"version", m.version},
              {"model_id", m.model_id},
              {"model", m.model},
              {"n_layer", m.n_layer},
              {"ctx", m.ctx},
              {"ring", m.ring},
              {"ms_per_token", RoundMs(m.ms_per_token)},
              {"ranks", std::move(ranks)}};
}

Result<Manifest> ManifestFromJson(const json &j, const std::string &name) {
  Manifest m;
  auto fail = [&](const Status &s) { return s.WithContext(name); };
  if (!j.is_object()) return fail(Error("expected a JSON object"));
  for (Status s : {Get(j, "version", &m.version), Get(j, "model_id", &m.model_id),
                   Get(j, "model", &m.model), Get(j, "n_layer", &m.n_layer), Get(j, "ctx", &m.ctx),
                   Get(j, "ms_per_token", &m.ms_per_token)}) {
    if (!s.ok()) return fail(s);
  }
  if (!j.contains("ring") || !j["ring"].is_array())
    return fail(Error("field 'ring' must be an array"));
  for (const json &d : j["ring"]) {
    if (!d.is_string()) return fail(Error("ring: device names must be strings"));
    m.ring.push_back(d.get<std::string>());
  }
  if (!j.contains("ranks") || !j["ranks"].is_array()) {
    return fail(Error("field 'ranks' must be an array"));
  }
  for (size_t i = 0; i < j["ranks"].size(); ++i) {
    ManifestRank r;
    Status s = RankFromJson(j["ranks"][i], &r);
    if (!s.ok()) return fail(s.WithContext(fmt::format("rank {}", i)));
    m.ranks.push_back(std::move(r));
  }
  Status s = ValidateManifest(m);
  if (!s.ok()) return fail(s);
  return m;
}

Result<Manifest> ParseManifest(std::string_view text, const std::string &name) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Error("{}: not valid JSON", name);
  return ManifestFromJson(j, name);
}

Result<Manifest> LoadManifest(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error("{}: cannot open", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ParseManifest(ss.str(), path);
}

}  // namespace kvasir
