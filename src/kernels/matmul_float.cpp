// F32/F16/BF16 weights x f32 activations (Highway, dispatched at run time).
//
// Every (row, token) dot product is computed the same way whatever the tile around it: one vector
// accumulator over the full vectors of the row in order (MulAdd), then SumOfLanes, then the
// leftover columns one by one. Decode and prefill therefore give bit-identical results.
#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/kernels.h"
#include "kernels/matmul_internal.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul_float.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#ifndef KVASIR_KERNELS_MATMUL_FLOAT_ONCE
#define KVASIR_KERNELS_MATMUL_FLOAT_ONCE
namespace kvasir::kernels_internal {
enum class WeightKind { kF32, kF16, kBF16 };
}  // namespace kvasir::kernels_internal
#endif

HWY_BEFORE_NAMESPACE();
namespace kvasir::kernels_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

template <WeightKind K>
HWY_INLINE hn::Vec<DF> LoadWeights(DF df, const uint8_t* row, int64_t i) {
  if constexpr (K == WeightKind::kF32) {
    return hn::LoadU(df, reinterpret_cast<const float*>(row) + i);
  } else if constexpr (K == WeightKind::kF16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(row) + i));
  } else {
    const hn::Rebind<hwy::bfloat16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::bfloat16_t*>(row) + i));
  }
}

template <WeightKind K>
HWY_INLINE float ScalarWeight(const uint8_t* row, int64_t i) {
  if constexpr (K == WeightKind::kF32) {
    float f;  // rows may be unaligned (any row stride is allowed)
    std::memcpy(&f, row + 4 * i, sizeof(f));
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * i, sizeof(h));
    return K == WeightKind::kF16 ? F16ToF32(h) : BF16ToF32(h);
  }
}

// R rows x T tokens over the full vectors of columns [i0, i1) (multiples of the lane count). x: T
// rows of `cols` floats. The accumulators start from acc ([R * T] vectors, or zero if `first`) and
// are stored back there unless `last`, when the tile is finished: SumOfLanes, the leftover columns
// [i1, cols) one by one, out: [T, R]. Running a row in column chunks therefore performs the same
// operations in the same order as one pass over the row.
template <WeightKind K, int R, int T>
HWY_INLINE void Tile(const uint8_t* const* rows, const float* x, int64_t cols, int64_t i0,
                     int64_t i1, bool first, bool last, float* HWY_RESTRICT acc_buf, float* out) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      acc[r][t] = first ? hn::Zero(df) : hn::Load(df, acc_buf + (r * T + t) * lanes);
    }
  }
  for (int64_t i = i0; i < i1; i += lanes) {
    hn::Vec<DF> wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadWeights<K>(df, rows[r], i);
    for (int t = 0; t < T; ++t) {
      const auto xv = hn::LoadU(df, x + t * cols + i);
      for (int r = 0; r < R; ++r) acc[r][t] = hn::MulAdd(wv[r], xv, acc[r][t]);
    }
  }
  if (!last) {
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) hn::Store(acc[r][t], df, acc_buf + (r * T + t) * lanes);
    }
    return;
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float s = hn::GetLane(hn::SumOfLanes(df, acc[r][t]));
      for (int64_t j = i1; j < cols; ++j) s += ScalarWeight<K>(rows[r], j) * x[t * cols + j];
      out[t * R + r] = s;
    }
  }
}

// Prefill tiles: R rows x T tokens of accumulators held in registers, so that each weight vector
// (converted once from f16/bf16) feeds T multiply-adds and each activation vector R. The tile takes
// R * T accumulators + R weights + 1 activation register.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kTileRows = 6;  // 32 vector registers: 24 accumulators
constexpr int kTileTokens = 4;
constexpr int kDecodeRows = 8;
#else
constexpr int kTileRows = 3;  // 16 vector registers: 12 accumulators
constexpr int kTileTokens = 4;
constexpr int kDecodeRows = 4;
#endif
// Rows whose weights stay in L2 while every token tile streams past (a multiple of kTileRows).
constexpr int64_t kPanelRows = 8 * kTileRows;
// Columns per chunk: a token tile's activations over one chunk (kTileTokens * 2 KiB) stay in L1
// while the row tiles of the panel run over it, instead of being re-read from L2 for each.
constexpr int64_t kChunkCols = 512;

// Tile of R rows x nt tokens (nt <= kTileTokens).
template <WeightKind K, int R, int T = kTileTokens>
HWY_INLINE void TileTokens(const uint8_t* const* rows, const float* x, int64_t cols, int64_t nt,
                           int64_t i0, int64_t i1, bool first, bool last, float* acc_buf,
                           float* out) {
  if constexpr (T > 1) {
    if (nt < T)
      return TileTokens<K, R, T - 1>(rows, x, cols, nt, i0, i1, first, last, acc_buf, out);
  }
  Tile<K, R, T>(rows, x, cols, i0, i1, first, last, acc_buf, out);
}

template <WeightKind K>
void FloatRows(const MatrixView& w, const float* x, int64_t n_tokens, float* y, int64_t row_begin,
               int64_t row_end) {
  const auto* data = static_cast<const uint8_t*>(w.data);
  const int64_t cols = w.cols;
  constexpr int kMaxRows = kDecodeRows > kTileRows ? kDecodeRows : kTileRows;
  float out[kTileTokens * kMaxRows];
  const uint8_t* rows[kMaxRows];
  auto set_rows = [&](int64_t r0, int64_t nr, int count) {
    for (int i = 0; i < count; ++i) {
      rows[i] = data + static_cast<size_t>(r0 + std::min<int64_t>(i, nr - 1)) * w.row_bytes;
    }
  };
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t full = cols / lanes * lanes;  // columns in full vectors
  if (n_tokens == 1) {
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kDecodeRows) {
      const int64_t nr = std::min<int64_t>(kDecodeRows, row_end - r0);
      set_rows(r0, nr, kDecodeRows);
      Tile<K, kDecodeRows, 1>(rows, x, cols, 0, full, true, true, nullptr, out);
      for (int64_t r = 0; r < nr; ++r) y[r0 + r] = out[r];
    }
    return;
  }
  // Accumulators of one token tile x every row tile of a panel between column chunks: [kPanelRows /
  // kTileRows][kTileRows * kTileTokens][lanes] f32.
  constexpr int64_t kTileAcc = kTileRows * kTileTokens;
  HWY_ALIGN float acc_buf[kPanelRows * kTileTokens * hn::MaxLanes(DF())];
  for (int64_t p0 = row_begin; p0 < row_end; p0 += kPanelRows) {
    const int64_t p1 = std::min(p0 + kPanelRows, row_end);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kTileTokens) {
      const int64_t nt = std::min<int64_t>(kTileTokens, n_tokens - t0);
      for (int64_t i0 = 0; i0 < full || i0 == 0; i0 += kChunkCols) {
        const int64_t i1 = std::min(i0 + kChunkCols, full);
        const bool first = i0 == 0;
        const bool last = i1 == full;
        for (int64_t r0 = p0; r0 < p1; r0 += kTileRows) {
          const int64_t nr = std::min<int64_t>(kTileRows, p1 - r0);
          set_rows(r0, nr, kTileRows);
          float* acc = acc_buf + (r0 - p0) / kTileRows * kTileAcc * lanes;
          TileTokens<K, kTileRows>(rows, x + t0 * cols, cols, nt, i0, i1, first, last, acc, out);
          if (!last) continue;
          for (int64_t t = 0; t < nt; ++t) {
            for (int64_t r = 0; r < nr; ++r) y[(t0 + t) * w.rows + r0 + r] = out[t * kTileRows + r];
          }
        }
        if (last) break;
      }
    }
  }
}

void MatMulFloatRowsT(const MatrixView& w, const float* x, int64_t n_tokens, float* y,
                      int64_t row_begin, int64_t row_end) {
  switch (w.type) {
    case TensorType::kF32:
      return FloatRows<WeightKind::kF32>(w, x, n_tokens, y, row_begin, row_end);
    case TensorType::kF16:
      return FloatRows<WeightKind::kF16>(w, x, n_tokens, y, row_begin, row_end);
    case TensorType::kBF16:
      return FloatRows<WeightKind::kBF16>(w, x, n_tokens, y, row_begin, row_end);
    default:
      KV_CHECK(false, "float MatMul: type {}", static_cast<uint32_t>(w.type));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvasir::kernels_internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvasir::kernels_internal {

HWY_EXPORT(MatMulFloatRowsT);

void MatMulFloatRows(const MatrixView& w, const float* x, int64_t n_tokens, float* y,
                     int64_t row_begin, int64_t row_end) {
  HWY_DYNAMIC_DISPATCH(MatMulFloatRowsT)(w, x, n_tokens, y, row_begin, row_end);
}

}  // namespace kvasir::kernels_internal
#endif  // HWY_ONCE
