// Registering a model with the market (`kvasir market add-model`): its identity, per-tensor
// digests and the windows of each ring, planned for expected devices or split evenly.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "market/store.h"
#include "planner/model_cost.h"
#include "planner/tensor_hash.h"

namespace kvasir::market {

// The bound on what one ring can run, for crediting receipts (docs/MARKET.md, "Credit is
// bounded"): every window's step is timed by the planner on the fastest device the market expects
// (kFastestMsPerGib to read a GiB of weights, an HBM accelerator), but at least kMinStepMs, and a
// step runs at most kMaxBatchRows rows; the ring is as fast as its slowest window, and the bound
// is kRateSlack times that.
inline constexpr double kFastestMsPerGib = 0.25;
inline constexpr double kMinStepMs = 0.5;
inline constexpr int kMaxBatchRows = 256;
inline constexpr double kRateSlack = 2;

struct ModelSpecOptions {
  std::string model_path;  // local GGUF (read for its header and hashed)
  std::string url;         // where stages fetch it
  std::string name;        // default: the file's stem
  int rings = 1;
  int windows = 0;           // even split into this many windows, or
  std::string devices_path;  // plan the windows for these devices (docs/MANIFEST.md)
  int ctx = 0;  // 0: min(2048, the model's trained context); more than that is refused
  double max_rows_per_s = 0;  // 0: RingRowsPerSecond's estimate
};

// The most token rows per second a ring of windows `cuts` ([first, last) each) of the model can
// run, by the rule above.
double RingRowsPerSecond(const ModelCost& cost, const std::vector<std::pair<int, int>>& cuts);

// Reads and hashes the model and cuts its rings. Errors name the file and the broken constraint
// (more windows than layers, fewer than 2 windows, a name the API would refuse, a context over
// the model's).
Result<ModelSpec> BuildModelSpec(const ModelSpecOptions& options,
                                 const HashProgressFn& progress = {});

}  // namespace kvasir::market
