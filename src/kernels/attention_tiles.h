// The inner loops of softmax attention on the CPU, over keys packed in blocks so that one vector
// holds the scores of several keys (no horizontal sum per key), and over values row by row.
//
// Every result has one fixed order of operations, whatever the SIMD target, the number of rows a
// call is given or the block range: a score is (sum over even d + sum over odd d) * scale, each
// sum a chain of fused multiply-adds in ascending d; a weighted value is a chain of fused
// multiply-adds in ascending key order from zero, times the row's scale. So a query row's output
// does not depend on how rows were batched (decode and prefill agree bit for bit), on targets with
// fused multiply-add.
#pragma once

#include <cstdint>

namespace kvasir {

// Keys per packed block.
inline constexpr int kKeyBlock = 16;

// Packs keys 0 .. n_keys-1 of one head, key j at k + j * k_stride ([head_dim] f32), into
// packed: [ceil(n_keys / kKeyBlock), head_dim, kKeyBlock] f32, zero past n_keys.
void PackKeys(const float* k, int64_t k_stride, int n_keys, int head_dim, float* packed);

// For rows r < n_rows (query r at q + r * q_stride, [head_dim] f32) and the keys of blocks
// [block_begin, block_end) of `packed` (as PackKeys writes it):
// scores[r * s_stride + j] = scale * (q_r . k_j), j indexing keys from the first block of packed.
void KeyScores(const float* q, int64_t q_stride, int n_rows, const float* packed, int block_begin,
               int block_end, int head_dim, float scale, float* scores, int64_t s_stride);

// The unnormalised softmax of scores[0, n), in place: scores[j] = exp(scores[j] - max). Returns
// 1 / (sum of those). n >= 1.
float ExpScores(float* scores, int n);

// For rows r < n_rows: out[r * o_stride + d] = row_scale[r] * (the sum over j in [j_begin,
// j_end), ascending, of p[r * p_stride + j] * v[j * v_stride + d]), for d < head_dim.
void WeightedValues(const float* p, int64_t p_stride, int n_rows, int j_begin, int j_end,
                    const float* v, int64_t v_stride, int head_dim, const float* row_scale,
                    float* out, int64_t o_stride);

}  // namespace kvasir
