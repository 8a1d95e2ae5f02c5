#include "cli/backend_flag.h"

#include <fmt/format.h>

#include "cli/cli_util.h"

namespace kvasir::cli {

CLI::Option* AddBackendFlag(CLI::App& app, std::string* spec) {
  return app
      .add_option(
          "--backend", *spec,
          "where the layers run: " + BackendSyntax() + " (`kvasir devices` lists this machine's)")
      ->capture_default_str();
}

std::optional<int> CheckBackendFlag(std::string_view cmd, std::string_view flag,
                                    const std::string& spec) {
  auto parsed = ParseBackendSpec(spec);
  if (!parsed.ok()) return UsageError(cmd, fmt::format("{}: {}", flag, parsed.status().message()));
  if (Status s = CheckBackendBuilt(*parsed); !s.ok()) {
    return Fail(cmd, fmt::format("{}: {}", flag, s.message()));
  }
  return std::nullopt;
}

Result<DeviceInfo> FindDevice(const std::string& spec) {
  KV_ASSIGN_OR_RETURN(BackendSpec parsed, ParseBackendSpec(spec));
  const std::string address = parsed.ToString();
  for (const BackendDevices& b : ListAllDevices()) {
    if (b.backend != parsed.name) continue;
    if (!b.status.ok()) return b.status.WithContext(fmt::format("backend {}", address));
    for (const DeviceInfo& d : b.devices) {
      if (d.address == address) return d;
    }
    return Error("backend {}: no such device here ({} has {})", address, b.backend,
                 b.devices.size());
  }
  return Error("backend {}: unknown", address);
}

std::string DeviceLabel(const std::string& spec) {
  auto d = FindDevice(spec);
  return d.ok() ? fmt::format("{} ({})", d->address, d->name) : spec;
}

}  // namespace kvasir::cli
