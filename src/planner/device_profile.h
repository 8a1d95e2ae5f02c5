// DeviceProfile: one machine that may run a stage, as the planner sees it: a memory budget, the
// measured decode speed, and its uplink. Parsed from devices.json (schema in docs/MANIFEST.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvasir {

struct DeviceProfile {
  std::string name;
  // The compute backend its stage runs on, as --backend takes it ("cpu", "opencl:0:0", "cuda:1");
  // written to the device's rank in the manifest.
  std::string backend = "cpu";
  std::string kind;             // informational: "cpu", "gpu", "npu", "phone", or empty
  uint64_t memory_bytes = 0;    // budget for weights + KV + process overhead
  // Measured decode time per GiB of weights read, in milliseconds (smaller = more bandwidth).
  double ms_per_gib = 0;
  // Uplink to the next stage. Absent link = same host: no latency, unlimited bandwidth.
  double rtt_ms = 0;
  double bandwidth_mbps = 0;  // megabits per second; 0 = unlimited

  // Milliseconds to send `bytes` to the next stage over this device's uplink.
  double HopMs(uint64_t bytes) const {
    double transfer = bandwidth_mbps > 0 ? double(bytes) * 8.0 / (bandwidth_mbps * 1e3) : 0.0;
    return rtt_ms + transfer;
  }
};

// Parses devices.json text. `name` (the file name) starts every error, which then names the device
// and field: "devices.json: device 'phone-1': ms_per_gib must be > 0 (got -3)".
Result<std::vector<DeviceProfile>> ParseDevices(std::string_view text, const std::string &name);
// Reads and parses a devices file; errors name the path.
Result<std::vector<DeviceProfile>> LoadDevices(const std::string &path);

}  // namespace kvasir
