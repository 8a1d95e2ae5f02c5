#include "backend/cpu/cpu_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/kernels.h"

namespace kvasir::cpu {

void CpuAttention(const float* q, int n, int pos0, const float* k, const float* v,
                  const AttentionParams& p, float* out, ThreadPool& pool) {
  const int head_dim = p.head_dim;
  const int group = p.n_head / p.n_head_kv;
  const int64_t q_stride = static_cast<int64_t>(p.n_head) * head_dim;
  const int64_t kv_stride = static_cast<int64_t>(p.n_head_kv) * head_dim;
  const float scale = p.scale;
  const float softcap = p.softcap;
  const int64_t n_items = static_cast<int64_t>(n) * p.n_head;
  pool.ParallelFor(n_items, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int t = static_cast<int>(item / p.n_head);
      const int h = static_cast<int>(item % p.n_head);
      const int pos = pos0 + t;
      // Causal: keys 0 .. pos; with a sliding window only the last `window` of them.
      const int j0 = p.window > 0 ? std::max(0, pos - p.window + 1) : 0;
      const int n_kv = pos + 1 - j0;
      const float* qh = q + t * q_stride + static_cast<int64_t>(h) * head_dim;
      const int64_t kv_off = static_cast<int64_t>(h / group) * head_dim + j0 * kv_stride;
      scores.resize(n_kv);
      for (int j = 0; j < n_kv; ++j) {
        scores[j] = DotF32(qh, k + j * kv_stride + kv_off, head_dim) * scale;
      }
      if (softcap > 0.0f) {
        for (int j = 0; j < n_kv; ++j) scores[j] = softcap * std::tanh(scores[j] / softcap);
      }
      Softmax(scores.data(), n_kv);
      float* oh = out + t * q_stride + static_cast<int64_t>(h) * head_dim;
      for (int d = 0; d < head_dim; ++d) oh[d] = 0.0f;
      for (int j = 0; j < n_kv; ++j) Axpy(scores[j], v + j * kv_stride + kv_off, head_dim, oh);
    }
  });
}

}  // namespace kvasir::cpu
