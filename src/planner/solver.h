// The planner's solver: picks the devices, their ring order and a contiguous window of layers for
// each so that the estimated per-token decode time is smallest and every window fits its device.
//
// Cost model (per decoded token, milliseconds):
//   sum over ranks of WindowReadBytes / GiB * ms_per_gib
//   + sum over hops (the ring closing hop included; none for a single stage) of the sender's
//     rtt_ms + boundary_bytes_per_token over its bandwidth.
// A window fits when WindowWeightBytes + WindowKvBytes (KV of ctx tokens for its attention layers,
// the fixed recurrent state of its DeltaNet layers) + overhead is at most the device's memory_bytes.
// Mixture-of-experts layers hold all their experts but read only the routed ones per token. Every used device holds at least one layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "planner/device_profile.h"
#include "planner/model_cost.h"

namespace kvasir {

struct PlanOptions {
  int ctx = 4096;                                 // tokens of KV cache each stage reserves
  uint64_t overhead_bytes = kStageOverheadBytes;  // per stage process
  // Up to this many devices the search is exact (every subset and order); beyond it the exact
  // search runs on the fastest and on the largest devices and keeps the better plan.
  int exact_max_devices = 10;
};

struct PlannedRank {
  std::string device;       // DeviceProfile::name
  std::string backend;      // DeviceProfile::backend
  int first = 0, last = 0;  // layers [first, last)
  bool has_embed = false, has_head = false;
  uint64_t weight_bytes = 0;  // held in memory
  uint64_t kv_bytes = 0;      // at the planned context
  uint64_t memory_bytes = 0;  // weights + KV + overhead
  uint64_t budget_bytes = 0;  // the device's memory_bytes
  double compute_ms = 0;      // per token
  double hop_ms = 0;          // sending the boundary to the next rank
  double ms_per_token() const { return compute_ms + hop_ms; }
};

struct LeftOutDevice {
  std::string device;
  // "adding it would raise the per-token time from 41.0 ms to 47.5 ms"
  std::string reason;
};

struct Plan {
  int n_layer = 0;
  int ctx = 0;
  std::vector<PlannedRank> ranks;  // ring order; ranks[0] holds layer 0
  std::vector<LeftOutDevice> left_out;
  double ms_per_token = 0;  // sum of ranks' ms_per_token
};

// The best plan, or an error naming the broken constraint ("devices hold 3.1 GiB, the model needs
// 3.9 GiB at ctx 4096"). Pure function of its inputs.
Result<Plan> SolvePlan(const ModelCost &cost, const std::vector<DeviceProfile> &devices,
                       const PlanOptions &options = {});

// Per-token milliseconds of `device` running [first, last) (no hop).
double WindowComputeMs(const ModelCost &cost, const DeviceProfile &device, int first, int last);
// Whether [first, last) fits the device's budget at `options.ctx`.
bool WindowFits(const ModelCost &cost, const DeviceProfile &device, int first, int last,
                const PlanOptions &options);

// "3.1 GiB", "12.0 MiB", "512 B": one decimal, for planner messages and tables.
std::string PlannerBytes(uint64_t bytes);
// "41.0 ms", or "0.052 ms" under a millisecond.
std::string PlannerMs(double ms);

}  // namespace kvasir
