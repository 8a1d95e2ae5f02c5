#include "backend/cpu/cpu_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/attention_units.h"
#include "kernels/attention_tiles.h"

namespace kvasir::cpu {
void CpuAttention(const float* q, int n, int pos0, const float* k, const float* v,
                  const AttentionParams& p, float* out, ThreadPool& pool) {
  const int hd = p.head_dim;
  const int group = p.n_head / p.n_head_kv;
  const int64_t q_stride = static_cast<int64_t>(p.n_head) * hd;
  const int64_t kv_stride = static_cast<int64_t>(p.n_head_kv) * hd;
  const int n_keys = pos0 + n;
  const int n_blocks = (n_keys + kKeyBlock - 1) / kKeyBlock;
  const int64_t width = static_cast<int64_t>(n_blocks) * kKeyBlock;  // a row of scores
  // Causal: a query at position pos sees keys first_key(pos) .. pos.
  auto first_key = [&](int pos) { return p.window > 0 ? std::max(0, pos - p.window + 1) : 0; };

  // [n_head_kv, n_blocks, head_dim, kKeyBlock] f32: each KV head's keys, packed once per call and
  // read by every query row of its group. Blocks no row sees (sliding window) stay unwritten.
  thread_local std::vector<float> packed;
  const int64_t head_pack = static_cast<int64_t>(n_blocks) * hd * kKeyBlock;
  packed.resize(static_cast<size_t>(p.n_head_kv * head_pack));
  float* packed_data = packed.data();
  const int block0 = first_key(pos0) / kKeyBlock;
  const int packed_blocks = n_blocks - block0;
  pool.ParallelFor(int64_t{p.n_head_kv} * packed_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int g = static_cast<int>(item / packed_blocks);
      const int b = block0 + static_cast<int>(item % packed_blocks);
      PackKeys(k + static_cast<int64_t>(b) * kKeyBlock * kv_stride + static_cast<int64_t>(g) * hd,
               kv_stride, std::min(kKeyBlock, n_keys - b * kKeyBlock), hd,
               packed_data + g * head_pack + static_cast<int64_t>(b) * hd * kKeyBlock);
    }
  });

  const AttentionUnits units(p.n_head_kv, group, n, pool.size());
  pool.ParallelFor(units.size(), 1, [&](int64_t begin, int64_t end) {
    // [tokens, heads, width] f32: a unit's scores, then its weights, at absolute key indices.
    thread_local std::vector<float> scores;
    for (int64_t unit = begin; unit < end; ++unit) {
      const auto [g, t0, t1, h0, h1] = units[unit];
      const int nt = t1 - t0, nh = h1 - h0;
      scores.resize(static_cast<size_t>(int64_t{nt} * nh * width));
      const float* pk = packed_data + g * head_pack;
      if (nh >= 4) {
        // Rows of one token, across heads: decode's case, where tokens are few.
        for (int t = t0; t < t1; ++t) {
          KeyScores(q + t * q_stride + static_cast<int64_t>(h0) * hd, hd, nh, pk,
                    first_key(pos0 + t) / kKeyBlock, (pos0 + t) / kKeyBlock + 1, hd, p.scale,
                    scores.data() + (t - t0) * nh * width, width);
        }
      } else {
        for (int h = h0; h < h1; ++h) {
          KeyScores(q + t0 * q_stride + static_cast<int64_t>(h) * hd, q_stride, nt, pk,
                    first_key(pos0 + t0) / kKeyBlock, (pos0 + t1 - 1) / kKeyBlock + 1, hd, p.scale,
                    scores.data() + (h - h0) * width, nh * width);
        }
      }
      for (int t = t0; t < t1; ++t) {
        const int pos = pos0 + t;
        const int j0 = first_key(pos), n_kv = pos + 1 - j0;
        float* rows = scores.data() + (t - t0) * nh * width;
        float inv_sum[kMaxHeadsPerUnit];
        for (int r = 0; r < nh; ++r) {
          float* s = rows + r * width + j0;
          if (p.softcap > 0.0f) {
            for (int j = 0; j < n_kv; ++j) s[j] = p.softcap * std::tanh(s[j] / p.softcap);
          }
          inv_sum[r] = ExpScores(s, n_kv);
        }
        WeightedValues(rows, width, nh, j0, pos + 1, v + static_cast<int64_t>(g) * hd, kv_stride,
                       hd, inv_sum, out + t * q_stride + static_cast<int64_t>(h0) * hd, hd);
      }
    }
  });
}

}  // namespace kvasir::cpu
