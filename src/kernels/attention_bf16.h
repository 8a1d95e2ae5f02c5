// Attention inner loops with bf16 operands and f32 sums (x86-64 AVX512-BF16, vdpbf16ps): the
// opt-in `--attn-type bf16` of the CPU backend. Keys, values, queries and the softmax weights are
// rounded to bf16 (round to nearest even, subnormals flushed to zero); every product of two bf16
// is exact in f32 and the sums are f32, two products per instruction, twice the multiply-adds per
// cycle of an f32 fused multiply-add.
//
// As in attention_tiles.h, a result has one order of operations whatever the rows batched with it
// or the block range: a score is (the chain over even pairs of d + the chain over odd pairs) *
// scale, each chain one vdpbf16ps per pair (d, d + 1) in ascending order; a weighted value is one
// chain of vdpbf16ps over the pairs of keys (2i, 2i + 1) in ascending order from the pair holding
// the first key, times the row's scale. So decode and prefill agree bit for bit.
//
// Call these only when HaveBf16Attention(): they execute AVX512-BF16 instructions.
#pragma once

#include <cstdint>

namespace kvasir {

// True when this build has the kernels (x86-64, GCC or Clang) and this CPU has AVX512F, AVX512BW
// and AVX512-BF16.
bool HaveBf16Attention();

// f32 -> bf16, round to nearest even, a subnormal input or result flushed to a signed zero (as the
// AVX512-BF16 conversions do).
uint16_t RoundToBf16(float x);
float Bf16ToFloat(uint16_t b);

// Keys per packed block (one 512-bit vector holds a pair of d of 16 keys).
inline constexpr int kBf16KeyBlock = 16;

// Packs keys 0 .. n_keys-1 of one head, key j at k + j * k_stride ([head_dim] f32), as bf16 into
// packed: [ceil(n_keys / 16), ceil(head_dim / 2), 16, 2] bf16 (per block, per pair of d, per key:
// d even then d odd), zero past n_keys and past head_dim.
void PackKeysBf16(const float* k, int64_t k_stride, int n_keys, int head_dim, uint16_t* packed);

// Values per pair row of PackValuesBf16: head_dim rounded up to 16.
inline int Bf16ValueWidth(int head_dim) { return (head_dim + 15) / 16 * 16; }

// Packs value pairs [pair_begin, pair_end) of one head (value j at v + j * v_stride, [head_dim]
// f32; values from 2 * pair_begin to min(2 * pair_end, n_keys) exist) as bf16 into packed + i *
// 2 * Bf16ValueWidth(head_dim) for pair i: [pairs, Bf16ValueWidth(head_dim), 2] bf16, (v[2i][d],
// v[2i+1][d]), zero past n_keys and past head_dim.
void PackValuesBf16(const float* v, int64_t v_stride, int n_keys, int pair_begin, int pair_end,
                    int head_dim, uint16_t* packed);

// As KeyScores (attention_tiles.h) with q rounded to bf16 and keys packed by PackKeysBf16:
// scores[r * s_stride + j] = scale * (q_r . k_j) for the keys of blocks [block_begin, block_end).
void KeyScoresBf16(const float* q, int64_t q_stride, int n_rows, const uint16_t* packed,
                   int block_begin, int block_end, int head_dim, float scale, float* scores,
                   int64_t s_stride);

// Bf16 pairs of keys, key j_begin / 2 * 2 first: what SoftmaxBf16 writes per row.
inline int Bf16WeightPairs(int j_begin, int j_end) { return (j_end + 1) / 2 - j_begin / 2; }

// For rows r < n_rows, the softmax weights of scores[r * s_stride + j], j in [j_begin, j_end)
// (j_end > j_begin): exp(score - the row's max) rounded to bf16, in pairs of keys from
// weights[r * w_stride] on ((key 2i, key 2i + 1) for i from j_begin / 2, Bf16WeightPairs of them;
// keys outside the range zero), and inv_sum[r] = 1 / (the sum of the rounded weights). The
// exponential is within 3e-7 relative of exp (well inside bf16's rounding) and 0 below -126.
void SoftmaxBf16(const float* scores, int64_t s_stride, int n_rows, int j_begin, int j_end,
                 uint32_t* weights, int64_t w_stride, float* inv_sum);

// For rows r < n_rows: out[r * o_stride + d] = row_scale[r] * the sum over j in [j_begin, j_end)
// of w_j * v_j[d], the weights as SoftmaxBf16 writes them (from weights + r * w_stride) and the
// values packed by PackValuesBf16 (holding the pairs from j_begin / 2 on), for d < head_dim.
void WeightedValuesBf16(const uint32_t* weights, int64_t w_stride, int n_rows, int j_begin,
                        int j_end, const uint16_t* packed, int head_dim, const float* row_scale,
                        float* out, int64_t o_stride);

}  // namespace kvasir
