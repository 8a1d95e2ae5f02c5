#include "market/model_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "gguf/gguf_file.h"
#include "market/api.h"
#include "market/proof.h"
#include "model/arch/registry.h"
#include "model/model_id.h"
#include "planner/device_profile.h"
#include "planner/model_cost.h"
#include "planner/solver.h"

namespace kvasir::market {

double RingRowsPerSecond(const ModelCost& cost, const std::vector<std::pair<int, int>>& cuts) {
  DeviceProfile fastest;
  fastest.name = "fastest";
  fastest.ms_per_gib = kFastestMsPerGib;
  double slowest_ms = kMinStepMs;
  for (auto [first, last] : cuts) {
    slowest_ms = std::max(slowest_ms, WindowComputeMs(cost, fastest, first, last));
  }
  return kRateSlack * kMaxBatchRows * 1000.0 / slowest_ms;
}

Result<ModelSpec> BuildModelSpec(const ModelSpecOptions& o, const HashProgressFn& progress) {
  ModelSpec spec;
  spec.name = o.name.empty() ? std::filesystem::path(o.model_path).stem().string() : o.name;
  if (!ValidName(spec.name)) {
    return Error("model name '{}': 1-64 characters from A-Z a-z 0-9 . _ - (use --name)",
                 spec.name);
  }
  if (o.rings < 1 || o.rings > 64) return Error("--rings {}: must be from 1 to 64", o.rings);
  if (o.ctx < 0) return Error("--ctx {}: must be positive", o.ctx);
  if (o.max_rows_per_s < 0 || !std::isfinite(o.max_rows_per_s)) {
    return Error("--max-rows-per-s {}: must be a positive number", o.max_rows_per_s);
  }
  if ((o.windows > 0) == !o.devices_path.empty()) {
    return Error("give exactly one of --windows N and --devices FILE");
  }
  KV_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(o.model_path));
  KV_ASSIGN_OR_RETURN(ModelCost cost, ComputeModelCost(file));
  KV_ASSIGN_OR_RETURN(ModelId id, ComputeModelId(file.header(), o.model_path));
  KV_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(file));
  spec.model_id = ModelIdHex(id);
  spec.url = o.url;
  spec.n_layer = cost.n_layer;
  // A session's rows are bounded by the context its stages reserve, which the model bounds.
  const int trained = config.n_ctx_train > 0 ? config.n_ctx_train : 2048;
  spec.ctx = o.ctx > 0 ? o.ctx : std::min(2048, trained);
  if (spec.ctx > trained) {
    return Error("--ctx {}: {} was trained for a context of {} tokens", spec.ctx, o.model_path,
                 trained);
  }

  // [first, last) of each window of one ring.
  std::vector<std::pair<int, int>> cuts;
  if (o.windows > 0) {
    if (o.windows < 2) return Error("--windows {}: a ring needs at least 2 windows", o.windows);
    if (o.windows > cost.n_layer) {
      return Error("--windows {}: {} has only {} layers", o.windows, o.model_path, cost.n_layer);
    }
    int first = 0;
    for (int w = 0; w < o.windows; ++w) {
      const int n = cost.n_layer / o.windows + (w < cost.n_layer % o.windows ? 1 : 0);
      cuts.emplace_back(first, first + n);
      first += n;
    }
  } else {
    KV_ASSIGN_OR_RETURN(auto devices, LoadDevices(o.devices_path));
    PlanOptions po;
    po.ctx = spec.ctx;
    KV_ASSIGN_OR_RETURN(Plan plan, SolvePlan(cost, devices, po));
    for (const PlannedRank& r : plan.ranks) cuts.emplace_back(r.first, r.last);
    if (cuts.size() < 2) {
      return Error("{}: the plan puts the whole model on one device; a ring needs at least 2 "
                   "windows (use --windows N)",
                   o.devices_path);
    }
  }
  std::vector<std::string> names;
  for (auto [first, last] : cuts) {
    for (std::string& n : cost.WindowTensors(first, last)) names.push_back(std::move(n));
  }
  KV_ASSIGN_OR_RETURN(auto hashes, HashTensors(file, names, progress));
  std::vector<WindowSpec> ring;
  for (auto [first, last] : cuts) {
    WindowSpec w;
    w.first = first;
    w.last = last;
    w.bytes = cost.WindowWeightBytes(first, last);
    w.memory = w.bytes + cost.WindowKvBytes(first, last, spec.ctx) + kStageOverheadBytes;
    for (const std::string& n : cost.WindowTensors(first, last)) {
      w.tensors.push_back({n, hashes.at(n)});
    }
    ring.push_back(std::move(w));
  }
  spec.rings.assign(static_cast<size_t>(o.rings), ring);
  // Each window of each ring keeps samples of its own, so holders of one ring learn nothing of
  // what another ring's holders are asked.
  std::mt19937_64 rng(std::random_device{}());
  for (auto& r : spec.rings) {
    for (WindowSpec& w : r) {
      std::vector<std::string> names;
      for (const TensorDigest& t : w.tensors) names.push_back(t.name);
      KV_ASSIGN_OR_RETURN(w.samples, SampleRanges(file, names, kSamplesPerWindow, rng));
    }
  }
  spec.max_rows_per_s = o.max_rows_per_s > 0 ? o.max_rows_per_s : RingRowsPerSecond(cost, cuts);
  return spec;
}

}  // namespace kvasir::market
