// kvasir devices: every device of every backend the engine knows, with its backend, name, memory
// and the weight types it runs; a backend this build lacks, or whose runtime has no device here,
// is listed with the reason.
#include <fmt/format.h>

#include "backend/registry.h"
#include "cli/cli_util.h"
#include "cli/commands.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "devices";

nlohmann::json DevicesJson(const std::vector<BackendDevices>& all) {
  nlohmann::json out = nlohmann::json::array();
  for (const BackendDevices& b : all) {
    nlohmann::json j = {{"backend", b.backend}, {"built", b.built}};
    if (!b.status.ok()) j["error"] = b.status.message();
    nlohmann::json devices = nlohmann::json::array();
    for (const DeviceInfo& d : b.devices) {
      nlohmann::json types = nlohmann::json::array();
      for (TensorType t : d.types) types.push_back(TensorTypeName(static_cast<uint32_t>(t)));
      devices.push_back({{"address", d.address},
                         {"name", d.name},
                         {"memory_bytes", d.memory_bytes},
                         {"free_bytes", d.free_bytes},
                         {"types", types}});
    }
    j["devices"] = devices;
    out.push_back(j);
  }
  return {{"backends", out}};
}

}  // namespace

int DevicesMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{"List the devices this machine can run layers on, by backend.", "kvasir devices"};
    bool json = false;
    app.add_flag("--json", json, "print one JSON object instead of a table");
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    const std::vector<BackendDevices> all = ListAllDevices();
    if (json) {
      std::printf("%s\n", DevicesJson(all).dump(2).c_str());
      return kExitOk;
    }
    using A = Table::Align;
    Table t({"backend", "device (--backend)", "name", "memory", "free", "types"},
            {A::kLeft, A::kLeft, A::kLeft, A::kRight, A::kRight, A::kLeft});
    std::string missing;  // backends without devices here, and why
    for (const BackendDevices& b : all) {
      for (const DeviceInfo& d : b.devices) {
        t.AddRow({b.backend, d.address, d.name, HumanBytes(d.memory_bytes),
                  d.free_bytes > 0 ? HumanBytes(d.free_bytes) : "?", TypeList(d.types)});
      }
      if (!b.status.ok()) {
        missing += fmt::format("{}: {}\n", b.backend, OneLine(b.status.message(), 300));
      } else if (b.devices.empty()) {
        missing += fmt::format("{}: no device found\n", b.backend);
      }
    }
    std::fputs((t.Render() + missing).c_str(), stdout);
    return kExitOk;
  });
}

}  // namespace kvasir::cli
