#include "ring/chunk_plan.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace kvasir::ring {
namespace {

// Weight multiply-adds of one row through layer `il`'s token mixer.
double MixerMacs(const ModelConfig& cfg, int il) {
  const double embd = cfg.n_embd;
  if (cfg.layer_kind(il) == LayerKind::kDeltaNet) {
    const double conv_dim = cfg.ssm_conv_dim();
    const double inner = cfg.ssm_inner;
    const double state = cfg.ssm_state;
    // qkv, z, beta, alpha in; out; the convolution's taps; the delta rule's passes over each
    // value head's [state, state] matrix (decay, read with k, update, read with q).
    return embd * (conv_dim + inner + 2.0 * cfg.ssm_n_v_heads) + inner * embd +
           conv_dim * cfg.ssm_conv_kernel + 4.0 * cfg.ssm_n_v_heads * state * state;
  }
  const double q_rows = static_cast<double>(cfg.q_dim()) * (cfg.attn_output_gate ? 2 : 1);
  return embd * (q_rows + 2.0 * cfg.kv_dim()) + static_cast<double>(cfg.q_dim()) * embd;
}

// Weight multiply-adds of one row through a layer's FFN: of an MoE layer, only what a row uses.
double FfnMacs(const ModelConfig& cfg) {
  const double embd = cfg.n_embd;
  if (cfg.n_expert == 0) return 3.0 * embd * cfg.n_ff;
  double macs = embd * cfg.n_expert + 3.0 * embd * cfg.n_ff_exp * cfg.n_expert_used;
  if (cfg.n_ff_shexp > 0) macs += 3.0 * embd * cfg.n_ff_shexp + embd;
  return macs;
}

// Sum of q over q in (lo, hi].
double SumTo(double lo, double hi) { return (hi * (hi + 1) - lo * (lo + 1)) / 2; }

// Positions attended to by the rows at positions [p0, p0 + n): sum of min(p + 1, window).
double AttendedPositions(int p0, int n, int window) {
  const double lo = p0, hi = static_cast<double>(p0) + n;
  if (window <= 0 || hi <= window) return SumTo(lo, hi);
  if (lo >= window) return static_cast<double>(window) * n;
  return SumTo(lo, window) + static_cast<double>(window) * (hi - window);
}

}  // namespace

RowCost RowCostOf(const ModelConfig& cfg, AttnType attn_type) {
  const double attend_weight = attn_type == AttnType::kBf16 ? 2.0 : 4.0;
  RowCost cost;
  cost.attn_window = cfg.attn_window;
  for (int il = 0; il < cfg.n_layer; ++il) {
    cost.per_row += MixerMacs(cfg, il) + FfnMacs(cfg);
    if (cfg.layer_kind(il) == LayerKind::kAttention) {
      cost.per_position += attend_weight * 2.0 * cfg.n_head * cfg.head_dim;
    }
  }
  return cost;
}

double RowsCost(const RowCost& cost, int n_cached, int n) {
  return cost.per_row * n + cost.per_position * AttendedPositions(n_cached, n, cost.attn_window);
}

std::vector<int> PlanChunks(const RowCost& cost, int n_cached, int n_new, int max_rows) {
  KV_CHECK(max_rows >= 1 && n_cached >= 0, "chunk plan: max_rows {} n_cached {}", max_rows,
           n_cached);
  if (n_new <= 0) return {};
  const double total = RowsCost(cost, n_cached, n_new);
  const double budget = RowsCost(cost, 0, max_rows);
  int n_chunks = (n_new + max_rows - 1) / max_rows;
  // The same arithmetic for a fresh prompt of max_rows rows and for the budget: exactly one.
  // Each chunk pays its own pass over the weights, so the work adds chunks only up to what
  // keeps the stages busy, and none to a prompt the row cap already cuts that finely.
  if (budget > 0 && total > budget && n_chunks < kPipelineChunks) {
    const double by_work =
        std::min<double>({static_cast<double>(n_new), static_cast<double>(kPipelineChunks),
                          std::ceil(total / budget)});
    n_chunks = std::max(n_chunks, static_cast<int>(by_work));
  }
  std::vector<int> sizes;
  sizes.reserve(static_cast<size_t>(n_chunks));
  int end = 0;  // rows cut so far
  for (int c = 1; c < n_chunks; ++c) {
    // The cut whose cost is nearest to c / n_chunks of the whole (ties: the shorter chunk),
    // leaving a row for every chunk after it and at most max_rows rows in this one.
    const double target = total * c / n_chunks;
    const int lo = end + 1;
    const int hi = std::min(end + max_rows, n_new - (n_chunks - c));
    int cut = lo;
    while (cut < hi && RowsCost(cost, n_cached, cut + 1) <= target) ++cut;
    if (cut < hi &&
        RowsCost(cost, n_cached, cut + 1) - target < target - RowsCost(cost, n_cached, cut)) {
      ++cut;
    }
    sizes.push_back(cut - end);
    end = cut;
  }
  sizes.push_back(n_new - end);
  return sizes;
}

}  // namespace kvasir::ring
