// Attention inner loops (attention_tiles.h), Highway, dispatched at run time.
#include "kernels/attention_tiles.h"

#include <algorithm>
#include <cmath>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_tiles.cpp"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
// clang-format on
#if HWY_ARCH_X86
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports the undefined pass-through operands inside the AVX-512 intrinsic headers as
// maybe-uninitialized (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "kernels/transpose_avx512.h"
#endif

HWY_BEFORE_NAMESPACE();
namespace kvasir::kernels_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

void PackKeysT(const float* k, int64_t k_stride, int n_keys, int hd, float* packed) {
  const int n_blocks = (n_keys + kKeyBlock - 1) / kKeyBlock;
  for (int b = 0; b < n_blocks; ++b) {
    float* out = packed + static_cast<int64_t>(b) * hd * kKeyBlock;
    const float* kb = k + static_cast<int64_t>(b) * kKeyBlock * k_stride;
    const int in_block = std::min(kKeyBlock, n_keys - b * kKeyBlock);
    int d0 = 0;  // dimensions [0, d0) of a whole block packed by the vector path
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    // A transpose in registers: Zen 4 microcodes gathers (docs/PERFORMANCE.md, "Prompt cache").
    static_assert(kKeyBlock == 16);
    if (in_block == kKeyBlock) {
      for (; d0 + 16 <= hd; d0 += 16) Transpose16x16(kb + d0, k_stride, out + d0 * kKeyBlock);
    }
#else
    if (in_block == kKeyBlock && kKeyBlock * k_stride < (int64_t{1} << 31)) {
      // One gather per vector of keys: the writes stay contiguous.
      const DF df;
      const hn::RebindToSigned<DF> di;
      const int lanes = static_cast<int>(hn::Lanes(df));
      for (int off = 0; off < kKeyBlock; off += lanes) {
        const auto idx = hn::Mul(hn::Iota(di, off), hn::Set(di, static_cast<int32_t>(k_stride)));
        for (int d = 0; d < hd; ++d) {
          hn::StoreU(hn::GatherIndex(df, kb + d, idx), df, out + d * kKeyBlock + off);
        }
      }
      d0 = hd;
    }
#endif
    if (in_block < kKeyBlock) std::fill_n(out, int64_t{hd} * kKeyBlock, 0.0f);
    for (int jj = 0; jj < in_block; ++jj) {
      const float* kj = kb + jj * k_stride;
      for (int d = d0; d < hd; ++d) out[d * kKeyBlock + jj] = kj[d];
    }
  }
}

// R query rows against the keys of blocks [b0, b1): per row two accumulators (even and odd d).
template <int R>
void ScoreRows(const float* q, int64_t q_stride, const float* packed, int b0, int b1, int hd,
               float scale, float* s, int64_t s_stride) {
  const DF df;
  const int lanes = static_cast<int>(hn::Lanes(df));
  const auto vscale = hn::Set(df, scale);
  for (int b = b0; b < b1; ++b) {
    const float* kb = packed + static_cast<int64_t>(b) * hd * kKeyBlock;
    for (int off = 0; off < kKeyBlock; off += lanes) {
      VF even[R], odd[R];
      for (int r = 0; r < R; ++r) even[r] = odd[r] = hn::Zero(df);
      int d = 0;
      for (; d + 2 <= hd; d += 2) {
        const auto k0 = hn::LoadU(df, kb + d * kKeyBlock + off);
        const auto k1 = hn::LoadU(df, kb + (d + 1) * kKeyBlock + off);
        for (int r = 0; r < R; ++r) {
          even[r] = hn::MulAdd(hn::Set(df, q[r * q_stride + d]), k0, even[r]);
          odd[r] = hn::MulAdd(hn::Set(df, q[r * q_stride + d + 1]), k1, odd[r]);
        }
      }
      if (d < hd) {
        const auto k0 = hn::LoadU(df, kb + d * kKeyBlock + off);
        for (int r = 0; r < R; ++r) {
          even[r] = hn::MulAdd(hn::Set(df, q[r * q_stride + d]), k0, even[r]);
        }
      }
      const int64_t j = static_cast<int64_t>(b) * kKeyBlock + off;
      for (int r = 0; r < R; ++r) {
        hn::StoreU(hn::Mul(hn::Add(even[r], odd[r]), vscale), df, s + r * s_stride + j);
      }
    }
  }
}

void KeyScoresT(const float* q, int64_t q_stride, int n_rows, const float* packed, int b0, int b1,
                int hd, float scale, float* s, int64_t s_stride) {
  int r = 0;
  for (; r + 4 <= n_rows; r += 4) {
    ScoreRows<4>(q + r * q_stride, q_stride, packed, b0, b1, hd, scale, s + r * s_stride, s_stride);
  }
  for (; r < n_rows; ++r) {
    ScoreRows<1>(q + r * q_stride, q_stride, packed, b0, b1, hd, scale, s + r * s_stride, s_stride);
  }
}

// exp(v) for v <= 0, flushed to zero below the f32 range (Highway's Exp holds on [-FLT_MAX, 88]).
HWY_INLINE VF ExpNonPositive(DF df, VF v) {
  const auto lo = hn::Set(df, -87.0f);
  return hn::IfThenZeroElse(hn::Lt(v, lo), hn::CallExp(df, hn::Max(v, lo)));
}

float ExpScoresT(float* s, int n) {
  const DF df;
  const int lanes = static_cast<int>(hn::Lanes(df));
  auto vmax = hn::Set(df, s[0]);
  int j = 0;
  for (; j + lanes <= n; j += lanes) vmax = hn::Max(vmax, hn::LoadU(df, s + j));
  float max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  for (; j < n; ++j) max = std::max(max, s[j]);
  const auto vm = hn::Set(df, max);
  // The sum in f32 lanes: each lane adds at most n / lanes values in [0, 1].
  auto acc = hn::Zero(df);
  auto step = [&](float* x) {
    const auto e = ExpNonPositive(df, hn::Sub(hn::LoadU(df, x), vm));
    hn::StoreU(e, df, x);
    acc = hn::Add(acc, e);
  };
  for (j = 0; j + lanes <= n; j += lanes) step(s + j);
  if (j < n) {
    // The tail through a padded copy (padding at -inf adds zeros), on the same vector path.
    HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)];
    std::fill_n(tail, lanes, -std::numeric_limits<float>::infinity());
    std::copy_n(s + j, n - j, tail);
    step(tail);
    std::copy_n(tail, n - j, s + j);
  }
  return static_cast<float>(1.0 / static_cast<double>(hn::GetLane(hn::SumOfLanes(df, acc))));
}

// R rows of weights against the values in [j0, j1), C vectors of d at a time from d0.
template <int R, int C>
void ValueColumns(const float* p, int64_t p_stride, int j0, int j1, const float* v,
                  int64_t v_stride, int d0, const float* row_scale, float* out, int64_t o_stride) {
  const DF df;
  const int lanes = static_cast<int>(hn::Lanes(df));
  VF acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = hn::Zero(df);
  }
  for (int j = j0; j < j1; ++j) {
    const float* vj = v + static_cast<int64_t>(j) * v_stride + d0;
    VF x[C];
    for (int c = 0; c < C; ++c) x[c] = hn::LoadU(df, vj + c * lanes);
    for (int r = 0; r < R; ++r) {
      const auto w = hn::Set(df, p[r * p_stride + j]);
      for (int c = 0; c < C; ++c) acc[r][c] = hn::MulAdd(w, x[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const auto scale = hn::Set(df, row_scale[r]);
    for (int c = 0; c < C; ++c) {
      hn::StoreU(hn::Mul(acc[r][c], scale), df, out + r * o_stride + d0 + c * lanes);
    }
  }
}

template <int R>
void ValueRows(const float* p, int64_t p_stride, int j0, int j1, const float* v, int64_t v_stride,
               int hd, const float* row_scale, float* out, int64_t o_stride) {
  const DF df;
  const int lanes = static_cast<int>(hn::Lanes(df));
  int d = 0;
  for (; d + 4 * lanes <= hd; d += 4 * lanes) {
    ValueColumns<R, 4>(p, p_stride, j0, j1, v, v_stride, d, row_scale, out, o_stride);
  }
  for (; d + lanes <= hd; d += lanes) {
    ValueColumns<R, 1>(p, p_stride, j0, j1, v, v_stride, d, row_scale, out, o_stride);
  }
  for (; d < hd; ++d) {
    for (int r = 0; r < R; ++r) {
      float acc = 0.0f;
      for (int j = j0; j < j1; ++j) {
        acc = std::fma(p[r * p_stride + j], v[static_cast<int64_t>(j) * v_stride + d], acc);
      }
      out[r * o_stride + d] = acc * row_scale[r];
    }
  }
}

void WeightedValuesT(const float* p, int64_t p_stride, int n_rows, int j0, int j1, const float* v,
                     int64_t v_stride, int hd, const float* row_scale, float* out,
                     int64_t o_stride) {
  // Four rows share each loaded value vector where the registers hold 4 x 4 accumulators.
  constexpr int kRows = HWY_MAX_BYTES >= 64 ? 4 : 2;
  int r = 0;
  for (; r + kRows <= n_rows; r += kRows) {
    ValueRows<kRows>(p + r * p_stride, p_stride, j0, j1, v, v_stride, hd, row_scale + r,
                     out + r * o_stride, o_stride);
  }
  for (; r < n_rows; ++r) {
    ValueRows<1>(p + r * p_stride, p_stride, j0, j1, v, v_stride, hd, row_scale + r,
                 out + r * o_stride, o_stride);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvasir::kernels_internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvasir {
namespace kernels_internal {
namespace {
HWY_EXPORT(PackKeysT);
HWY_EXPORT(KeyScoresT);
HWY_EXPORT(ExpScoresT);
HWY_EXPORT(WeightedValuesT);
}  // namespace
}  // namespace kernels_internal

void PackKeys(const float* k, int64_t k_stride, int n_keys, int head_dim, float* packed) {
  HWY_DYNAMIC_DISPATCH(kernels_internal::PackKeysT)(k, k_stride, n_keys, head_dim, packed);
}

void KeyScores(const float* q, int64_t q_stride, int n_rows, const float* packed, int block_begin,
               int block_end, int head_dim, float scale, float* scores, int64_t s_stride) {
  HWY_DYNAMIC_DISPATCH(kernels_internal::KeyScoresT)
  (q, q_stride, n_rows, packed, block_begin, block_end, head_dim, scale, scores, s_stride);
}

float ExpScores(float* scores, int n) {
  return HWY_DYNAMIC_DISPATCH(kernels_internal::ExpScoresT)(scores, n);
}

void WeightedValues(const float* p, int64_t p_stride, int n_rows, int j_begin, int j_end,
                    const float* v, int64_t v_stride, int head_dim, const float* row_scale,
                    float* out, int64_t o_stride) {
  HWY_DYNAMIC_DISPATCH(kernels_internal::WeightedValuesT)
  (p, p_stride, n_rows, j_begin, j_end, v, v_stride, head_dim, row_scale, out, o_stride);
}

}  // namespace kvasir
#endif  // HWY_ONCE
