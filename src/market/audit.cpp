#include "market/audit.h"

#include <fmt/format.h>

#include <limits>

namespace kvasir::market {
namespace {

using nlohmann::json;

std::string Hex(const std::vector<uint8_t>& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

Result<std::vector<uint8_t>> Unhex(const std::string& s, const std::string& what) {
  if (s.size() % 2 != 0) return Error("{}: an odd number of hex digits", what);
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return Error("{}: not lowercase hex", what);
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return out;
}

json SideJson(const ring::RowSide& side) {
  return {{"kind", static_cast<int>(side.kind)}, {"data", Hex(side.bytes)}};
}

Result<uint64_t> Uint(const json& j, const char* name, uint64_t max, const std::string& where) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_number_integer()) {
    return Error("{}: field '{}' must be an integer", where, name);
  }
  const bool negative = !it->is_number_unsigned() && it->get<int64_t>() < 0;
  if (negative || it->get<uint64_t>() > max) {
    return Error("{}: field '{}' must be from 0 to {}", where, name, max);
  }
  return it->get<uint64_t>();
}

Result<std::string> Text(const json& j, const char* name, size_t max, const std::string& where) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_string())
    return Error("{}: field '{}' must be a string", where, name);
  if (it->get_ref<const std::string&>().size() > max) {
    return Error("{}: field '{}' is longer than {} characters", where, name, max);
  }
  return it->get<std::string>();
}

Result<ring::RowSide> ParseSide(const json& j, const std::string& where) {
  if (!j.is_object()) return Error("{}: must be an object", where);
  ring::RowSide side;
  KV_ASSIGN_OR_RETURN(uint64_t kind, Uint(j, "kind", ring::kMaxRowKind, where));
  side.kind = static_cast<ring::RowKind>(kind);
  KV_ASSIGN_OR_RETURN(std::string data, Text(j, "data", 2 * kMaxRevealRowBytes, where));
  KV_ASSIGN_OR_RETURN(side.bytes, Unhex(data, where + ".data"));
  return side;
}

}  // namespace

json AuditRequestsToJson(const std::vector<AuditRequest>& requests) {
  json out = json::array();
  for (const AuditRequest& r : requests) {
    out.push_back({{"audit", r.id}, {"receipt", r.receipt}, {"positions", r.positions}});
  }
  return out;
}

Result<std::vector<AuditRequest>> ParseAuditRequests(const json& beat) {
  std::vector<AuditRequest> out;
  auto it = beat.find("audits");
  if (it == beat.end()) return out;
  if (!it->is_array() || it->size() > kMaxAuditsPerBeat) {
    return Error("'audits': must be an array of at most {}", kMaxAuditsPerBeat);
  }
  for (const json& a : *it) {
    const std::string where = "'audits'";
    if (!a.is_object()) return Error("{}: an element is not an object", where);
    AuditRequest r;
    KV_ASSIGN_OR_RETURN(uint64_t id, Uint(a, "audit", std::numeric_limits<int64_t>::max(), where));
    r.id = static_cast<int64_t>(id);
    KV_ASSIGN_OR_RETURN(r.receipt, Text(a, "receipt", 32, where));
    auto p = a.find("positions");
    if (p == a.end() || !p->is_array() || p->size() > ring::kMaxRevealPositions) {
      return Error("{}: 'positions' must be an array of at most {}", where,
                   ring::kMaxRevealPositions);
    }
    for (const json& v : *p) {
      if (!v.is_number_unsigned()) return Error("{}: a position is not a count", where);
      r.positions.push_back(v.get<uint64_t>());
    }
    out.push_back(std::move(r));
  }
  return out;
}

json AuditAnswerToJson(int64_t id, const Result<ring::RowReveal>& reveal) {
  if (!reveal.ok()) return {{"audit", id}, {"error", reveal.status().message()}};
  json positions = json::array();
  for (const ring::RevealedPosition& p : reveal->positions) {
    json path = json::array();
    for (const ring::Digest& d : p.path) path.push_back(ring::DigestHex(d));
    positions.push_back({{"index", p.index},
                         {"pos", p.rows.pos},
                         {"in", SideJson(p.rows.in)},
                         {"out", SideJson(p.rows.out)},
                         {"path", path}});
  }
  return {{"audit", id}, {"n", reveal->n}, {"positions", positions}};
}

Result<std::vector<AuditAnswer>> ParseAuditAnswers(const json& body) {
  std::vector<AuditAnswer> out;
  auto it = body.find("reveals");
  if (it == body.end()) return out;
  if (!it->is_array() || it->size() > kMaxAuditsPerBeat) {
    return Error("field 'reveals': must be an array of at most {} answers", kMaxAuditsPerBeat);
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& a = (*it)[i];
    const std::string where = fmt::format("field 'reveals[{}]'", i);
    if (!a.is_object()) return Error("{}: must be an object", where);
    AuditAnswer ans;
    KV_ASSIGN_OR_RETURN(uint64_t id, Uint(a, "audit", std::numeric_limits<int64_t>::max(), where));
    ans.id = static_cast<int64_t>(id);
    if (a.contains("error")) {
      KV_ASSIGN_OR_RETURN(ans.refusal, Text(a, "error", 1024, where));
      if (ans.refusal.empty()) ans.refusal = "refused";
      out.push_back(std::move(ans));
      continue;
    }
    KV_ASSIGN_OR_RETURN(ans.reveal.n, Uint(a, "n", std::numeric_limits<uint32_t>::max(), where));
    auto p = a.find("positions");
    if (p == a.end() || !p->is_array() || p->size() > ring::kMaxRevealPositions) {
      return Error("{}: 'positions' must be an array of at most {}", where,
                   ring::kMaxRevealPositions);
    }
    for (size_t k = 0; k < p->size(); ++k) {
      const json& e = (*p)[k];
      const std::string at = fmt::format("{}.positions[{}]", where, k);
      if (!e.is_object()) return Error("{}: must be an object", at);
      ring::RevealedPosition rp;
      KV_ASSIGN_OR_RETURN(rp.index, Uint(e, "index", std::numeric_limits<uint32_t>::max(), at));
      KV_ASSIGN_OR_RETURN(uint64_t pos, Uint(e, "pos", std::numeric_limits<uint32_t>::max(), at));
      rp.rows.pos = static_cast<uint32_t>(pos);
      if (!e.contains("in") || !e.contains("out")) return Error("{}: needs 'in' and 'out'", at);
      KV_ASSIGN_OR_RETURN(rp.rows.in, ParseSide(e.at("in"), at + ".in"));
      KV_ASSIGN_OR_RETURN(rp.rows.out, ParseSide(e.at("out"), at + ".out"));
      auto path = e.find("path");
      if (path == e.end() || !path->is_array() || path->size() > 64) {
        return Error("{}: 'path' must be an array of at most 64 digests", at);
      }
      for (const json& d : *path) {
        if (!d.is_string()) return Error("{}: a path digest is not a string", at);
        auto digest = ring::ParseDigestHex(d.get<std::string>());
        if (!digest.ok()) return Error("{}: path: {}", at, digest.status().message());
        rp.path.push_back(*digest);
      }
      ans.reveal.positions.push_back(std::move(rp));
    }
    out.push_back(std::move(ans));
  }
  return out;
}

}  // namespace kvasir::market
