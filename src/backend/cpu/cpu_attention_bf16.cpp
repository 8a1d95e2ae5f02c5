// CpuAttentionBf16 (cpu_attention.h): the units of CpuAttention over keys and values rounded to
// bf16 and packed once per call (kernels/attention_bf16.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/attention_units.h"
#include "backend/cpu/cpu_attention.h"
#include "base/check.h"
#include "kernels/attention_bf16.h"

namespace kvasir::cpu {
void CpuAttentionBf16(const float* q, int n, int pos0, const float* k, const float* v,
                      const AttentionParams& p, float* out, ThreadPool& pool) {
  KV_CHECK(HaveBf16Attention(), "bf16 attention on a CPU without AVX512-BF16");
  const int hd = p.head_dim, hdp = (hd + 1) / 2, width_v = Bf16ValueWidth(hd);
  const int group = p.n_head / p.n_head_kv;
  const int64_t q_stride = static_cast<int64_t>(p.n_head) * hd;
  const int64_t kv_stride = static_cast<int64_t>(p.n_head_kv) * hd;
  const int n_keys = pos0 + n;
  const int n_blocks = (n_keys + kBf16KeyBlock - 1) / kBf16KeyBlock;
  const int n_pairs = (n_keys + 1) / 2;
  const int64_t width = static_cast<int64_t>(n_blocks) * kBf16KeyBlock;  // a row of scores
  auto first_key = [&](int pos) { return p.window > 0 ? std::max(0, pos - p.window + 1) : 0; };

  // [n_head_kv, n_blocks, hdp, 16, 2] bf16: each KV head's keys; [n_head_kv, n_pairs, width_v, 2]
  // bf16: its values in pairs of keys. Packed once per call; what no row sees stays unwritten.
  thread_local std::vector<uint16_t> packed_k, packed_v;
  const int64_t head_k = static_cast<int64_t>(n_blocks) * hdp * 2 * kBf16KeyBlock;
  const int64_t head_v = static_cast<int64_t>(n_pairs) * width_v * 2;
  packed_k.resize(static_cast<size_t>(p.n_head_kv * head_k));
  packed_v.resize(static_cast<size_t>(p.n_head_kv * head_v));
  uint16_t* pk_data = packed_k.data();
  uint16_t* pv_data = packed_v.data();
  const int block0 = first_key(pos0) / kBf16KeyBlock;
  const int pair0 = first_key(pos0) / 2;
  const int k_items = n_blocks - block0;
  // A work item packs one block of 16 keys and the 8 pairs of values of the same keys.
  pool.ParallelFor(int64_t{p.n_head_kv} * k_items, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int g = static_cast<int>(item / k_items);
      const int b = block0 + static_cast<int>(item % k_items);
      const int64_t head_off = static_cast<int64_t>(g) * hd;
      PackKeysBf16(k + static_cast<int64_t>(b) * kBf16KeyBlock * kv_stride + head_off, kv_stride,
                   std::min(kBf16KeyBlock, n_keys - b * kBf16KeyBlock), hd,
                   pk_data + g * head_k + static_cast<int64_t>(b) * hdp * 2 * kBf16KeyBlock);
      const int i0 = std::max(pair0, b * kBf16KeyBlock / 2);
      const int i1 = std::min(n_pairs, (b + 1) * kBf16KeyBlock / 2);
      PackValuesBf16(v + head_off, kv_stride, n_keys, i0, i1, hd, pv_data + g * head_v);
    }
  });

  const AttentionUnits units(p.n_head_kv, group, n, pool.size());
  pool.ParallelFor(units.size(), 1, [&](int64_t begin, int64_t end) {
    // [heads, width] f32: one token's scores; [heads, width / 2] bf16 pairs: its weights.
    thread_local std::vector<float> scores;
    thread_local std::vector<uint32_t> weights;
    for (int64_t unit = begin; unit < end; ++unit) {
      const auto [g, t0, t1, h0, h1] = units[unit];
      const int nh = h1 - h0;
      scores.resize(static_cast<size_t>(int64_t{nh} * width));
      weights.resize(static_cast<size_t>(int64_t{nh} * width / 2));
      for (int t = t0; t < t1; ++t) {
        const int pos = pos0 + t;
        const int j0 = first_key(pos), n_kv = pos + 1 - j0;
        KeyScoresBf16(q + t * q_stride + static_cast<int64_t>(h0) * hd, hd, nh,
                      pk_data + g * head_k, j0 / kBf16KeyBlock, pos / kBf16KeyBlock + 1, hd,
                      p.scale, scores.data(), width);
        if (p.softcap > 0.0f) {
          for (int r = 0; r < nh; ++r) {
            float* s = scores.data() + r * width + j0;
            for (int j = 0; j < n_kv; ++j) s[j] = p.softcap * std::tanh(s[j] / p.softcap);
          }
        }
        float inv_sum[kMaxHeadsPerUnit];
        SoftmaxBf16(scores.data(), width, nh, j0, pos + 1, weights.data(), width / 2, inv_sum);
        WeightedValuesBf16(weights.data(), width / 2, nh, j0, pos + 1, pv_data + g * head_v, hd,
                           inv_sum, out + t * q_stride + static_cast<int64_t>(h0) * hd, hd);
      }
    }
  });
}

}  // namespace kvasir::cpu
