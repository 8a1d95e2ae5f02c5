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

// R rows x T tokens over the whole row. x: T rows of `cols` floats; out: [T, R].
template <WeightKind K, int R, int T>
HWY_INLINE void Tile(const uint8_t* const* rows, const float* x, int64_t cols, float* out) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = hn::Zero(df);
  }
  int64_t i = 0;
  for (; i + lanes <= cols; i += lanes) {
    hn::Vec<DF> wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadWeights<K>(df, rows[r], i);
    for (int t = 0; t < T; ++t) {
      const auto xv = hn::LoadU(df, x + t * cols + i);
      for (int r = 0; r < R; ++r) acc[r][t] = hn::MulAdd(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float s = hn::GetLane(hn::SumOfLanes(df, acc[r][t]));
      for (int64_t j = i; j < cols; ++j) s += ScalarWeight<K>(rows[r], j) * x[t * cols + j];
      out[t * R + r] = s;
    }
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kTileTokens = 4;  // 32 vector registers: 16 accumulators
constexpr int kDecodeRows = 8;
#else
constexpr int kTileTokens = 2;
constexpr int kDecodeRows = 4;
#endif
constexpr int kTileRows = 4;
constexpr int64_t kPanelRows = 64;  // rows whose weights stay in cache while tokens stream past

template <WeightKind K>
void FloatRows(const MatrixView& w, const float* x, int64_t n_tokens, float* y, int64_t row_begin,
               int64_t row_end) {
  const auto* data = static_cast<const uint8_t*>(w.data);
  const int64_t cols = w.cols;
  float out[kTileTokens * kDecodeRows];
  const uint8_t* rows[kDecodeRows];
  auto set_rows = [&](int64_t r0, int64_t nr, int count) {
    for (int i = 0; i < count; ++i) {
      rows[i] = data + static_cast<size_t>(r0 + std::min<int64_t>(i, nr - 1)) * w.row_bytes;
    }
  };
  if (n_tokens == 1) {
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kDecodeRows) {
      const int64_t nr = std::min<int64_t>(kDecodeRows, row_end - r0);
      set_rows(r0, nr, kDecodeRows);
      Tile<K, kDecodeRows, 1>(rows, x, cols, out);
      for (int64_t r = 0; r < nr; ++r) y[r0 + r] = out[r];
    }
    return;
  }
  for (int64_t p0 = row_begin; p0 < row_end; p0 += kPanelRows) {
    const int64_t p1 = std::min(p0 + kPanelRows, row_end);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kTileTokens) {
      const int64_t nt = std::min<int64_t>(kTileTokens, n_tokens - t0);
      for (int64_t r0 = p0; r0 < p1; r0 += kTileRows) {
        const int64_t nr = std::min<int64_t>(kTileRows, p1 - r0);
        set_rows(r0, nr, kTileRows);
        if (nt == kTileTokens) {
          Tile<K, kTileRows, kTileTokens>(rows, x + t0 * cols, cols, out);
        } else {
          for (int64_t t = 0; t < nt; ++t) {
            Tile<K, kTileRows, 1>(rows, x + (t0 + t) * cols, cols, out + t * kTileRows);
          }
        }
        for (int64_t t = 0; t < nt; ++t) {
          for (int64_t r = 0; r < nr; ++r) y[(t0 + t) * w.rows + r0 + r] = out[t * kTileRows + r];
        }
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
