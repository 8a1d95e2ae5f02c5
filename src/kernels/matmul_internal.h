// Internal interface between MatMul (threading, buffers) and the per-target SIMD kernels. Not part
// of the public kernels API.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/kernels.h"

namespace kvasir::kernels_internal {

inline constexpr int kQBlock = 32;   // values per Q8_0/Q4_0 block
inline constexpr int kActTile = 16;  // tokens per tile of QuantActs

// Activations quantized to Q8_0 for the integer matrix products (scales and values exactly as
// ggml's reference Q8_0 quantizer makes them), grouped in tiles of kActTile tokens. Tile i holds
// tokens [t0, t0 + nt), t0 = i * kActTile, nt = ActTileTokens(n_tokens, t0), block-major so that a
// kernel holding one weight block finds that block of every token of the tile side by side:
//   qs   + t0 * cols: [nb, nt, 32] int8
//   d    + t0 * nb:   [nb, nt] f32, the f16 scale widened
//   corr + t0 * nb:   [nb, nt] int32, -bias * (sum of the block's 32 values); kernels that feed
//                     unsigned weights (q + bias) to an unsigned x signed product add it back.
//   sum, sum_lo + t0 * nb: [nb, nt] int32, the sums of the block's 32 and of its first 16 values.
//   fsum + t0 * nb:   [nb, nt] f32, d * float(sum), exact (an 11-bit scale times a 12-bit sum).
struct QuantActs {
  int64_t n_tokens = 0;
  int64_t cols = 0;  // a multiple of kQBlock
  int8_t* qs = nullptr;
  float* d = nullptr;
  int32_t* corr = nullptr;
  int32_t* sum = nullptr;
  int32_t* sum_lo = nullptr;
  float* fsum = nullptr;
};

inline int64_t ActTileTokens(int64_t n_tokens, int64_t t0) {
  return std::min<int64_t>(kActTile, n_tokens - t0);
}

// The weight offset that turns a signed weight into the unsigned operand of the VNNI product:
// Q4_0 nibbles are already q + 8, Q5_0 values q + 16, Q8_0 values get 128 added (a sign-bit
// flip). The other types correct with the sums themselves (0: corr is zero).
inline int32_t UnsignedWeightBias(TensorType type) {
  switch (type) {
    case TensorType::kQ4_0:
      return 8;
    case TensorType::kQ5_0:
      return 16;
    case TensorType::kQ8_0:
      return 128;
    default:
      return 0;
  }
}

// Per-target entry points (dispatched with Highway to the best target of this CPU).

inline int64_t ActTiles(int64_t n_tokens) { return (n_tokens + kActTile - 1) / kActTile; }

// Quantizes the token tiles [tile_begin, tile_end) of x ([n_tokens, cols] row-major f32) into
// `out` (buffers already sized). Different tiles may be quantized concurrently.
void QuantizeActs(const float* x, int32_t bias, const QuantActs& out, int64_t tile_begin,
                  int64_t tile_end);
// y[t, r] for r in [row_begin, row_end), every token, quantized weights (any type for which
// IsQuantizedType holds). y: [n_tokens, w.rows] row-major f32.
void MatMulQuantRows(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                     int64_t row_end);
// The portable kernel of MatMulQuantRows for every quantized type but Q8_0/Q4_0 (which have their
// own), through the integer form of quant_ints.h.
void MatMulIntFormRows(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                       int64_t row_end);
// y[t, r] for r in [row_begin, row_end), every token, F32/F16/BF16 weights.
// x: [n_tokens, w.cols] row-major f32. y: [n_tokens, w.rows] row-major f32.
void MatMulFloatRows(const MatrixView& w, const float* x, int64_t n_tokens, float* y,
                     int64_t row_begin, int64_t row_end);

}  // namespace kvasir::kernels_internal
