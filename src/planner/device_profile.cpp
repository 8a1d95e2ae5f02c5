#include "planner/device_profile.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "backend/registry.h"

namespace kvasir {
namespace {

using nlohmann::json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

Result<double> PositiveNumber(const json &j, std::string_view field, bool allow_zero) {
  if (!j.is_number()) return Error("{} must be a number (got {})", field, j.dump());
  double v = j.get<double>();
  if (!std::isfinite(v) || v < 0 || (!allow_zero && v == 0)) {
    return Error("{} must be {} (got {})", field, allow_zero ? ">= 0" : "> 0", j.dump());
  }
  return v;
}

Status ParseLink(const json &link, DeviceProfile *d) {
  if (!link.is_object()) return Error("link must be an object");
  for (const auto &[key, value] : link.items()) {
    if (key == "rtt_ms") {
      KV_ASSIGN_OR_RETURN(d->rtt_ms, PositiveNumber(value, "link.rtt_ms", true));
    } else if (key == "bandwidth_mbps") {
      KV_ASSIGN_OR_RETURN(d->bandwidth_mbps, PositiveNumber(value, "link.bandwidth_mbps", false));
    } else {
      return Error("link: unknown field '{}' (known: rtt_ms, bandwidth_mbps)", key);
    }
  }
  return Status::Ok();
}

Status ParseDevice(const json &j, DeviceProfile *d) {
  bool has_memory = false, has_speed = false;
  for (const auto &[key, value] : j.items()) {
    if (key == "name") {
      continue;
    } else if (key == "backend") {
      if (!value.is_string()) return Error("backend must be a string");
      // The planning machine need not have this backend built: only the syntax is checked.
      auto spec = ParseBackendSpec(value.get<std::string>());
      if (!spec.ok()) {
        const std::string v = value.get<std::string>();
        const bool kind = v == "gpu" || v == "npu" || v == "phone";
        return Error("{}{}", spec.status().message(),
                     kind ? " (the device's kind, gpu, npu or phone, goes in \"kind\")" : "");
      }
      d->backend = spec->ToString();
    } else if (key == "kind") {
      if (!value.is_string()) return Error("kind must be a string");
      d->kind = value.get<std::string>();
      if (d->kind != "cpu" && d->kind != "gpu" && d->kind != "npu" && d->kind != "phone") {
        return Error("kind '{}' is not one of cpu, gpu, npu, phone", d->kind);
      }
    } else if (key == "memory_bytes") {
      if (!value.is_number_unsigned() || value.get<uint64_t>() == 0) {
        return Error("memory_bytes must be a positive integer (got {})", value.dump());
      }
      d->memory_bytes = value.get<uint64_t>();
      has_memory = true;
    } else if (key == "memory_gib") {
      KV_ASSIGN_OR_RETURN(double gib, PositiveNumber(value, "memory_gib", false));
      if (gib > 1e9) return Error("memory_gib {} is not plausible", gib);
      d->memory_bytes = uint64_t(gib * kGiB);
      has_memory = true;
    } else if (key == "ms_per_gib") {
      KV_ASSIGN_OR_RETURN(d->ms_per_gib, PositiveNumber(value, "ms_per_gib", false));
      has_speed = true;
    } else if (key == "link") {
      KV_RETURN_IF_ERROR(ParseLink(value, d));
    } else {
      return Error(
          "unknown field '{}' (known: name, backend, kind, memory_bytes, "
          "memory_gib, ms_per_gib, link)",
          key);
    }
  }
  if (!has_memory) return Error("missing memory_bytes (or memory_gib)");
  if (!has_speed) return Error("missing ms_per_gib (measure it with a decode benchmark)");
  return Status::Ok();
}

}  // namespace

Result<std::vector<DeviceProfile>> ParseDevices(std::string_view text, const std::string &name) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Error("{}: not valid JSON", name);
  if (!root.is_object() || !root.contains("devices") || !root["devices"].is_array()) {
    return Error("{}: expected an object with a \"devices\" array", name);
  }
  const json &list = root["devices"];
  if (list.empty()) return Error("{}: \"devices\" is empty", name);
  std::vector<DeviceProfile> devices;
  std::set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    const json &j = list[i];
    if (!j.is_object()) return Error("{}: device {}: expected an object", name, i);
    if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty()) {
      return Error("{}: device {}: missing name (a non-empty string)", name, i);
    }
    DeviceProfile d;
    d.name = j["name"].get<std::string>();
    if (!names.insert(d.name).second) {
      return Error("{}: device '{}': name used twice", name, d.name);
    }
    Status s = ParseDevice(j, &d);
    if (!s.ok()) return s.WithContext(fmt::format("{}: device '{}'", name, d.name));
    devices.push_back(std::move(d));
  }
  return devices;
}

Result<std::vector<DeviceProfile>> LoadDevices(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error("{}: cannot open", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ParseDevices(ss.str(), path);
}

}  // namespace kvasir
