#include "planner/solver.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <numeric>

namespace kvasir {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

uint64_t WindowMemory(const ModelCost &cost, int first, int last, const PlanOptions &o) {
  return cost.WindowWeightBytes(first, last) + cost.WindowKvBytes(first, last, o.ctx) +
         o.overhead_bytes;
}

// Exact search over every subset and order of `devices` (at most ~16) by dynamic programming over
// (set of devices used so far, layers covered so far).
struct ExactSearch {
  ExactSearch(const ModelCost &c, const std::vector<DeviceProfile> &d, const PlanOptions &o)
      : cost(c), devices(d), options(o) {}

  const ModelCost &cost;
  const std::vector<DeviceProfile> &devices;
  const PlanOptions &options;
  int n = 0, L = 0;
  // [n][L+1][L+1]: compute ms of device d on layers [a, b), inf if it does not fit
  std::vector<double> window_ms;
  std::vector<double> best;      // [1<<n][L+1]: least ms covering [0, l) with exactly `mask`
  std::vector<int> from_layer;   // [1<<n][L+1]
  std::vector<int> from_device;  // [1<<n][L+1]
  std::vector<double> total;     // [1<<n]: best[mask][L] plus the hops

  double &W(int d, int a, int b) { return window_ms[(size_t(d) * (L + 1) + a) * (L + 1) + b]; }
  size_t At(uint32_t mask, int l) const { return size_t(mask) * (L + 1) + l; }

  double HopsMs(uint32_t mask) const {
    if (std::popcount(mask) < 2) return 0;
    double ms = 0;
    for (int d = 0; d < n; ++d) {
      if (mask & (1u << d)) ms += devices[d].HopMs(cost.boundary_bytes_per_token);
    }
    return ms;
  }

  void Run() {
    n = int(devices.size());
    L = cost.n_layer;
    window_ms.assign(size_t(n) * (L + 1) * (L + 1), kInf);
    for (int d = 0; d < n; ++d) {
      for (int a = 0; a < L; ++a) {
        for (int b = a + 1; b <= L; ++b) {
          // Memory grows with the window, so the first window that does not fit ends the row.
          if (!WindowFits(cost, devices[d], a, b, options)) break;
          W(d, a, b) = WindowComputeMs(cost, devices[d], a, b);
        }
      }
    }
    size_t n_masks = size_t(1) << n;
    best.assign(n_masks * (L + 1), kInf);
    from_layer.assign(best.size(), -1);
    from_device.assign(best.size(), -1);
    best[At(0, 0)] = 0;
    for (uint32_t mask = 0; mask < n_masks; ++mask) {
      for (int a = 0; a < L; ++a) {
        double base = best[At(mask, a)];
        if (base == kInf) continue;
        for (int d = 0; d < n; ++d) {
          if (mask & (1u << d)) continue;
          uint32_t next = mask | (1u << d);
          for (int b = a + 1; b <= L; ++b) {
            double w = W(d, a, b);
            if (w == kInf) break;
            double c = base + w;
            if (c < best[At(next, b)]) {
              best[At(next, b)] = c;
              from_layer[At(next, b)] = a;
              from_device[At(next, b)] = d;
            }
          }
        }
      }
    }
    total.assign(n_masks, kInf);
    for (uint32_t mask = 1; mask < n_masks; ++mask) {
      if (best[At(mask, L)] != kInf) total[mask] = best[At(mask, L)] + HopsMs(mask);
    }
  }

  // The mask with the least total; ties go to fewer devices. 0 when nothing fits.
  uint32_t BestMask() const {
    uint32_t pick = 0;
    for (uint32_t mask = 1; mask < total.size(); ++mask) {
      if (total[mask] == kInf) continue;
      if (pick == 0 || total[mask] < total[pick] - 1e-12 ||
          (std::abs(total[mask] - total[pick]) <= 1e-12 &&
           std::popcount(mask) < std::popcount(pick))) {
        pick = mask;
      }
    }
    return pick;
  }

  double BestWith(int d) const {
    double v = kInf;
    for (uint32_t mask = 1; mask < total.size(); ++mask) {
      if (mask & (1u << d)) v = std::min(v, total[mask]);
    }
    return v;
  }

  // Ranks of `mask` in ring order.
  std::vector<PlannedRank> Ranks(uint32_t mask) const {
    std::vector<PlannedRank> ranks;
    bool hops = std::popcount(mask) >= 2;
    int b = L;
    while (mask != 0) {
      int a = from_layer[At(mask, b)], d = from_device[At(mask, b)];
      const DeviceProfile &dev = devices[d];
      PlannedRank r;
      r.device = dev.name;
      r.backend = dev.backend;
      r.first = a;
      r.last = b;
      r.has_embed = a == 0;
      r.has_head = b == L;
      r.weight_bytes = cost.WindowWeightBytes(a, b);
      r.kv_bytes = cost.WindowKvBytes(a, b, options.ctx);
      r.memory_bytes = WindowMemory(cost, a, b, options);
      r.budget_bytes = dev.memory_bytes;
      r.compute_ms = WindowComputeMs(cost, dev, a, b);
      r.hop_ms = hops ? dev.HopMs(cost.boundary_bytes_per_token) : 0;
      ranks.push_back(r);
      mask &= ~(1u << d);
      b = a;
    }
    std::reverse(ranks.begin(), ranks.end());
    return ranks;
  }
};

// Why nothing fits, naming the constraint and the numbers.
Status Infeasible(const ModelCost &cost, const std::vector<DeviceProfile> &devices,
                  const PlanOptions &o) {
  uint64_t held = 0;
  const DeviceProfile *largest = &devices[0];
  for (const auto &d : devices) {
    held += d.memory_bytes;
    if (d.memory_bytes > largest->memory_bytes) largest = &d;
  }
  uint64_t needed = WindowMemory(cost, 0, cost.n_layer, o);
  if (held < needed) {
    return Error(
        "devices hold {}, the model needs {} at ctx {} ({} weights, "
        "{} KV, {} overhead)",
        PlannerBytes(held), PlannerBytes(needed), o.ctx, PlannerBytes(cost.TotalWeightBytes()),
        PlannerBytes(cost.WindowKvBytes(0, cost.n_layer, o.ctx)), PlannerBytes(o.overhead_bytes));
  }
  for (int l = 0; l < cost.n_layer; ++l) {
    uint64_t alone = WindowMemory(cost, l, l + 1, o);
    if (alone > largest->memory_bytes) {
      return Error(
          "layer {} alone needs {} at ctx {} (weights, KV and {} "
          "overhead), more than the largest "
          "device budget ({}, {})",
          l, PlannerBytes(alone), o.ctx, PlannerBytes(o.overhead_bytes),
          PlannerBytes(largest->memory_bytes), largest->name);
    }
  }
  return Error(
      "no split of the {} layers into contiguous windows fits the devices at "
      "ctx {}: they hold {} "
      "in total for {} needed, but no window cut fits each device's budget",
      cost.n_layer, o.ctx, PlannerBytes(held), PlannerBytes(needed));
}

Status CheckInputs(const ModelCost &cost, const std::vector<DeviceProfile> &devices,
                   const PlanOptions &o) {
  if (cost.n_layer <= 0 || int(cost.layer_bytes.size()) != cost.n_layer) {
    return Error("model cost: n_layer {} with {} layer sizes", cost.n_layer,
                 cost.layer_bytes.size());
  }
  if (o.ctx <= 0) return Error("ctx must be > 0 (got {})", o.ctx);
  if (o.exact_max_devices < 1 || o.exact_max_devices > 16) {
    return Error("exact_max_devices must be in [1, 16] (got {})", o.exact_max_devices);
  }
  if (devices.empty()) return Error("no devices to plan for");
  for (const auto &d : devices) {
    if (!(d.ms_per_gib > 0)) return Error("device '{}': ms_per_gib must be > 0", d.name);
  }
  return Status::Ok();
}

// Runs the exact search on `subset` (indices into `devices`); returns the plan or total = inf.
struct SubsetResult {
  double total = kInf;
  std::vector<PlannedRank> ranks;
  std::vector<LeftOutDevice> left_out;
};

SubsetResult SolveSubset(const ModelCost &cost, const std::vector<DeviceProfile> &devices,
                         const PlanOptions &o) {
  ExactSearch search(cost, devices, o);
  search.Run();
  SubsetResult out;
  uint32_t mask = search.BestMask();
  if (mask == 0) return out;
  out.total = search.total[mask];
  out.ranks = search.Ranks(mask);
  for (int d = 0; d < int(devices.size()); ++d) {
    if (mask & (1u << d)) continue;
    double with = search.BestWith(d);
    std::string reason;
    if (with == kInf) {
      bool fits_any = false;
      for (int a = 0; a < cost.n_layer && !fits_any; ++a) {
        fits_any = WindowFits(cost, devices[d], a, a + 1, o);
      }
      reason = fits_any ? "no plan that fits every device's memory can include it"
                        : fmt::format("its budget ({}) holds no layer at ctx {}",
                                      PlannerBytes(devices[d].memory_bytes), o.ctx);
    } else if (PlannerMs(out.total) == PlannerMs(with)) {
      reason = fmt::format("adding it would not lower the per-token time ({:.3f} ms without it, "
                           "{:.3f} ms with it)",
                           out.total, with);
    } else {
      reason = fmt::format("adding it would raise the per-token time from {} to {}",
                           PlannerMs(out.total), PlannerMs(with));
    }
    out.left_out.push_back({devices[d].name, reason});
  }
  return out;
}

}  // namespace

double WindowComputeMs(const ModelCost &cost, const DeviceProfile &device, int first, int last) {
  return double(cost.WindowReadBytes(first, last)) / kGiB * device.ms_per_gib;
}

bool WindowFits(const ModelCost &cost, const DeviceProfile &device, int first, int last,
                const PlanOptions &options) {
  return WindowMemory(cost, first, last, options) <= device.memory_bytes;
}

std::string PlannerBytes(uint64_t bytes) {
  double b = double(bytes);
  if (b >= kGiB) return fmt::format("{:.1f} GiB", b / kGiB);
  if (b >= 1024.0 * 1024.0) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

std::string PlannerMs(double ms) {
  return ms < 1.0 ? fmt::format("{:.3f} ms", ms) : fmt::format("{:.1f} ms", ms);
}

Result<Plan> SolvePlan(const ModelCost &cost, const std::vector<DeviceProfile> &devices,
                       const PlanOptions &options) {
  KV_RETURN_IF_ERROR(CheckInputs(cost, devices, options));
  SubsetResult result;
  std::vector<LeftOutDevice> not_searched;
  if (int(devices.size()) <= options.exact_max_devices) {
    result = SolveSubset(cost, devices, options);
  } else {
    // Too many for the exact search: search the fastest and the largest devices, keep the better.
    size_t k = size_t(options.exact_max_devices);
    std::vector<size_t> order(devices.size());
    for (int pass = 0; pass < 2; ++pass) {
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
        return pass == 0 ? devices[x].ms_per_gib < devices[y].ms_per_gib
                         : devices[x].memory_bytes > devices[y].memory_bytes;
      });
      std::vector<DeviceProfile> picked;
      for (size_t i = 0; i < k; ++i) picked.push_back(devices[order[i]]);
      SubsetResult r = SolveSubset(cost, picked, options);
      if (r.total < result.total) {
        result = std::move(r);
        not_searched.clear();
        for (size_t i = k; i < order.size(); ++i) {
          not_searched.push_back(
              {devices[order[i]].name,
               fmt::format("not searched: only {} of {} devices are searched "
                           "exactly ({})",
                           k, devices.size(), pass == 0 ? "the fastest" : "the largest")});
        }
      }
    }
  }
  if (result.total == kInf) return Infeasible(cost, devices, options);
  Plan plan;
  plan.n_layer = cost.n_layer;
  plan.ctx = options.ctx;
  plan.ranks = std::move(result.ranks);
  plan.left_out = std::move(result.left_out);
  plan.left_out.insert(plan.left_out.end(), not_searched.begin(), not_searched.end());
  for (const auto &r : plan.ranks) plan.ms_per_token += r.ms_per_token();
  return plan;
}

}  // namespace kvasir
