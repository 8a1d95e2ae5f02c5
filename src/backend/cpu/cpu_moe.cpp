#include "backend/cpu/cpu_moe.h"

#include <algorithm>
#include <numeric>

namespace kvasir::cpu {
namespace {

// The smallest normal f16, as llama.cpp clamps the sum of the chosen weights.
constexpr float kMinWeightSum = 6.103515625e-5f;

void Grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

void CpuMoeRoute(float* logits, int n, int n_expert, int k, int32_t* ids, float* weights) {
  thread_local std::vector<int> order;  // [n_expert]: expert ids, sorted by probability
  order.resize(n_expert);
  for (int r = 0; r < n; ++r) {
    float* p = logits + static_cast<int64_t>(r) * n_expert;
    Softmax(p, n_expert);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [p](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += p[order[j]];
    sum = std::max(sum, kMinWeightSum);
    for (int j = 0; j < k; ++j) {
      ids[static_cast<int64_t>(r) * k + j] = order[j];
      weights[static_cast<int64_t>(r) * k + j] = p[order[j]] / sum;
    }
  }
}

void CpuMoeFfn(const std::vector<MatrixView>& gate, const std::vector<MatrixView>& up,
               const std::vector<MatrixView>& down, const float* in, int n, const int32_t* ids,
               const float* weights, int k, float* out, ThreadPool& pool, MoeScratch& s) {
  const int n_exp = static_cast<int>(gate.size());
  const int64_t e = down.front().rows, ff = gate.front().rows;
  const size_t picks = static_cast<size_t>(n) * k;

  // Group the row-slots by expert (counting sort), so each expert's rows are contiguous.
  s.start.assign(n_exp + 1, 0);
  for (size_t i = 0; i < picks; ++i) ++s.start[ids[i] + 1];
  for (int x = 0; x < n_exp; ++x) s.start[x + 1] += s.start[x];
  s.slot.resize(picks);
  s.pos.resize(picks);
  s.fill.assign(s.start.begin(), s.start.end() - 1);
  for (size_t i = 0; i < picks; ++i) {
    const int pos = s.fill[ids[i]]++;
    s.slot[pos] = static_cast<int>(i);
    s.pos[i] = pos;
  }

  // Each used expert over its rows: s.out [picks, n_embd] in grouped order.
  Grow(s.out, picks * e);
  for (int x = 0; x < n_exp; ++x) {
    const int m = s.start[x + 1] - s.start[x];
    if (m == 0) continue;
    Grow(s.in, static_cast<size_t>(m) * e);
    Grow(s.gate, static_cast<size_t>(m) * ff);
    Grow(s.up, static_cast<size_t>(m) * ff);
    for (int j = 0; j < m; ++j) {
      const size_t row = static_cast<size_t>(s.slot[s.start[x] + j] / k);
      std::copy_n(in + row * e, e, s.in.data() + static_cast<size_t>(j) * e);
    }
    MatMul(gate[x], s.in.data(), m, s.gate.data(), pool);
    MatMul(up[x], s.in.data(), m, s.up.data(), pool);
    SiluMul(s.gate.data(), s.up.data(), static_cast<int64_t>(m) * ff, s.gate.data());
    MatMul(down[x], s.gate.data(), m, s.out.data() + static_cast<size_t>(s.start[x]) * e, pool);
  }

  // out[r] = sum over slots, in top-k order, of weight * expert output.
  for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
    float* o = out + r * e;
    for (int j = 0; j < k; ++j) {
      const float* y = s.out.data() + static_cast<size_t>(s.pos[r * k + j]) * e;
      const float wt = weights[r * k + j];
      if (j == 0) {
        for (int i = 0; i < e; ++i) o[i] = wt * y[i];
      } else {
        for (int i = 0; i < e; ++i) o[i] += wt * y[i];
      }
    }
  }
}

}  // namespace kvasir::cpu
