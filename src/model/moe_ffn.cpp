// Mixture-of-experts FFN (qwen35moe): softmax router over all experts, top-k, weights renormalised
// to sum 1; each expert runs once per batch over the rows routed to it (so decode rows of many
// sessions share one pass over an expert's weights); a shared SwiGLU expert scaled by
// sigmoid(shared_gate x) is added. A row's result depends only on the row: an expert's matrix
// product is exact per row, and the experts' outputs are summed in top-k order.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/window_layers.h"

namespace kvasir {
namespace {

// The smallest normal f16, as llama.cpp clamps the sum of the chosen weights.
constexpr float kMinWeightSum = 6.103515625e-5f;

}  // namespace

void RunMoe(const ModelConfig& cfg, const MoeWeights& w, const float* in, int n_rows, float* out,
            Backend& be, LayerScratch& s) {
  const int e = cfg.n_embd, n_exp = cfg.n_expert, k = cfg.n_expert_used, ff = cfg.n_ff_exp;
  const size_t rows = static_cast<size_t>(n_rows);
  const size_t picks = rows * k;
  GrowScratch(s.router, rows * n_exp);
  s.route_weight.resize(picks);
  s.route_expert.resize(picks);
  be.MatMul(w.router, in, n_rows, s.router.data());

  // Route: [n_rows, n_expert] probabilities, the k largest (lower id first on ties).
  std::vector<int>& ids = s.route_ids;
  ids.resize(n_exp);
  for (size_t r = 0; r < rows; ++r) {
    float* p = s.router.data() + r * n_exp;
    Softmax(p, n_exp);
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [p](int a, int b) {
      return p[a] > p[b] || (p[a] == p[b] && a < b);
    });
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += p[ids[j]];
    sum = std::max(sum, kMinWeightSum);
    for (int j = 0; j < k; ++j) {
      s.route_expert[r * k + j] = ids[j];
      s.route_weight[r * k + j] = p[ids[j]] / sum;
    }
  }

  // Group the row-slots by expert (counting sort), so each expert's rows are contiguous.
  std::vector<int>& start = s.route_start;
  start.assign(n_exp + 1, 0);
  for (size_t i = 0; i < picks; ++i) ++start[s.route_expert[i] + 1];
  for (int x = 0; x < n_exp; ++x) start[x + 1] += start[x];
  s.route_slot.resize(picks);
  s.route_pos.resize(picks);
  s.route_fill.assign(start.begin(), start.end() - 1);
  for (size_t i = 0; i < picks; ++i) {
    const int pos = s.route_fill[s.route_expert[i]]++;
    s.route_slot[pos] = static_cast<int>(i);
    s.route_pos[i] = pos;
  }

  // Each used expert over its rows: expert_out [picks, n_embd] in grouped order.
  GrowScratch(s.expert_out, picks * e);
  for (int x = 0; x < n_exp; ++x) {
    const int m = start[x + 1] - start[x];
    if (m == 0) continue;
    GrowScratch(s.expert_in, static_cast<size_t>(m) * e);
    GrowScratch(s.expert_gate, static_cast<size_t>(m) * ff);
    GrowScratch(s.expert_up, static_cast<size_t>(m) * ff);
    for (int j = 0; j < m; ++j) {
      const size_t row = static_cast<size_t>(s.route_slot[start[x] + j] / k);
      std::copy_n(in + row * e, e, s.expert_in.data() + static_cast<size_t>(j) * e);
    }
    be.MatMul(w.gate[x], s.expert_in.data(), m, s.expert_gate.data());
    be.MatMul(w.up[x], s.expert_in.data(), m, s.expert_up.data());
    be.SiluMul(s.expert_gate.data(), s.expert_up.data(), static_cast<int64_t>(m) * ff,
               s.expert_gate.data());
    be.MatMul(w.down[x], s.expert_gate.data(), m,
              s.expert_out.data() + static_cast<size_t>(start[x]) * e);
  }

  // out[r] = sum over slots, in top-k order, of weight * expert output.
  for (size_t r = 0; r < rows; ++r) {
    float* o = out + r * e;
    for (int j = 0; j < k; ++j) {
      const float* y = s.expert_out.data() + static_cast<size_t>(s.route_pos[r * k + j]) * e;
      const float wt = s.route_weight[r * k + j];
      if (j == 0) {
        for (int i = 0; i < e; ++i) o[i] = wt * y[i];
      } else {
        for (int i = 0; i < e; ++i) o[i] += wt * y[i];
      }
    }
  }

  if (!w.has_shared) return;
  GrowScratch(s.ffn_sum, rows * e);
  GrowScratch(s.shared_scale, rows);
  RunDenseFfn(w.shared, cfg.n_ff_shexp, in, n_rows, s.ffn_sum.data(), be, s);
  be.MatMul(w.shared_gate, in, n_rows, s.shared_scale.data());
  for (size_t r = 0; r < rows; ++r) {
    s.shared_scale[r] = 1.0f / (1.0f + std::exp(-s.shared_scale[r]));
  }
  be.ScaleRows(s.ffn_sum.data(), s.shared_scale.data(), n_rows, e);
  be.Add(out, s.ffn_sum.data(), static_cast<int64_t>(rows) * e);
}

}  // namespace kvasir
