// bf16 attention loops (attention_bf16.h): AVX512-BF16 intrinsics under per-function target
// attributes, since Highway 1.0.3 has no op that emits vdpbf16ps.
#include "kernels/attention_bf16.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "base/check.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KV_HAVE_BF16_KERNELS 1
#if !defined(__clang__)
// GCC 12 reports the undefined pass-through operands inside the AVX-512 intrinsic headers as
// maybe-uninitialized (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "kernels/transpose_avx512.h"
#else
#define KV_HAVE_BF16_KERNELS 0
#endif

namespace kvasir {

uint16_t RoundToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7f800000u) == 0) return static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

#if KV_HAVE_BF16_KERNELS

#define KV_BF16_ATTR __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define KV_BF16_INLINE KV_BF16_ATTR inline __attribute__((always_inline))

bool HaveBf16Attention() {
  static const bool have = __builtin_cpu_supports("avx512f") &&
                           __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512bf16");
  return have;
}

namespace {

constexpr int kLanes = 16;  // f32 lanes of a 512-bit vector

// Lanes [lo, hi) of 16, clamped.
KV_BF16_INLINE __mmask16 LaneRange(int lo, int hi) {
  lo = std::clamp(lo, 0, kLanes);
  hi = std::clamp(hi, 0, kLanes);
  if (hi <= lo) return 0;
  return static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

// x[begin, end) of the 32 floats from x (others zero) as 16 pairs of bf16: lane l holds
// (x[2l], x[2l + 1]), the even one in the low half.
KV_BF16_INLINE __m512i PairsOf32(const float* x, int begin, int end) {
  const __m512 lo = _mm512_maskz_loadu_ps(LaneRange(begin, end), x);
  const __m512 hi = _mm512_maskz_loadu_ps(LaneRange(begin - kLanes, end - kLanes), x + kLanes);
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// Rounds n floats to bf16 pairs: out[i] = (x[2i], x[2i + 1]) for i < ceil(n / 2), zero past n.
KV_BF16_INLINE void ToPairs(const float* x, int n, uint32_t* out) {
  for (int i = 0; 2 * i < n; i += kLanes) {
    const __m512i v = PairsOf32(x + 2 * i, 0, n - 2 * i);
    _mm512_mask_storeu_epi32(out + i, LaneRange(0, (n - 2 * i + 1) / 2), v);
  }
}

KV_BF16_INLINE __m512 Dot(__m512 acc, uint32_t pair, __m512i x) {
  return _mm512_dpbf16_ps(acc,
                          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair))),
                          reinterpret_cast<__m512bh>(x));
}

template <int R>
KV_BF16_INLINE void ScoreRows(const uint32_t* qp, int qp_stride, int hdp, const uint16_t* packed,
                              int b0, int b1, float scale, float* s, int64_t s_stride) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int b = b0; b < b1; ++b) {
    const uint16_t* kb = packed + static_cast<int64_t>(b) * hdp * 2 * kBf16KeyBlock;
    __m512 even[R], odd[R];
    for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm512_setzero_ps();
    int dp = 0;
    for (; dp + 2 <= hdp; dp += 2) {
      const __m512i k0 = _mm512_loadu_si512(kb + dp * 2 * kBf16KeyBlock);
      const __m512i k1 = _mm512_loadu_si512(kb + (dp + 1) * 2 * kBf16KeyBlock);
      for (int r = 0; r < R; ++r) {
        even[r] = Dot(even[r], qp[r * qp_stride + dp], k0);
        odd[r] = Dot(odd[r], qp[r * qp_stride + dp + 1], k1);
      }
    }
    if (dp < hdp) {
      const __m512i k0 = _mm512_loadu_si512(kb + dp * 2 * kBf16KeyBlock);
      for (int r = 0; r < R; ++r) even[r] = Dot(even[r], qp[r * qp_stride + dp], k0);
    }
    for (int r = 0; r < R; ++r) {
      _mm512_storeu_ps(s + r * s_stride + static_cast<int64_t>(b) * kBf16KeyBlock,
                       _mm512_mul_ps(_mm512_add_ps(even[r], odd[r]), vscale));
    }
  }
}

// R rows of weight pairs (pp: [R, n_pairs]) against the value pairs from vp, C vectors of 16
// columns from column c0; stores columns below hd.
template <int R, int C>
KV_BF16_INLINE void ValueColumns(const uint32_t* pp, int64_t pp_stride, int n_pairs,
                                 const uint16_t* vp, int width, int c0, int hd,
                                 const float* row_scale, float* out, int64_t o_stride) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int i = 0; i < n_pairs; ++i) {
    const uint16_t* row = vp + static_cast<int64_t>(i) * 2 * width + 2 * c0;
    __m512i x[C];
    for (int c = 0; c < C; ++c) x[c] = _mm512_loadu_si512(row + c * 2 * kLanes);
    for (int r = 0; r < R; ++r) {
      const uint32_t w = pp[r * pp_stride + i];
      for (int c = 0; c < C; ++c) acc[r][c] = Dot(acc[r][c], w, x[c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 scale = _mm512_set1_ps(row_scale[r]);
    for (int c = 0; c < C; ++c) {
      const int d = c0 + c * kLanes;
      _mm512_mask_storeu_ps(out + r * o_stride + d, LaneRange(0, hd - d),
                            _mm512_mul_ps(acc[r][c], scale));
    }
  }
}

template <int R>
KV_BF16_INLINE void ValueRows(const uint32_t* pp, int64_t pp_stride, int n_pairs,
                              const uint16_t* vp, int hd, const float* row_scale, float* out,
                              int64_t o_stride) {
  const int width = Bf16ValueWidth(hd);
  int c0 = 0;
  for (; c0 + 4 * kLanes <= width; c0 += 4 * kLanes) {
    ValueColumns<R, 4>(pp, pp_stride, n_pairs, vp, width, c0, hd, row_scale, out, o_stride);
  }
  for (; c0 < width; c0 += kLanes) {
    ValueColumns<R, 1>(pp, pp_stride, n_pairs, vp, width, c0, hd, row_scale, out, o_stride);
  }
}

KV_BF16_ATTR void PackKeysBf16Impl(const float* k, int64_t k_stride, int n_keys, int hd,
                                   uint16_t* packed) {
  const int hdp = (hd + 1) / 2;
  const int n_blocks = (n_keys + kBf16KeyBlock - 1) / kBf16KeyBlock;
  const int row = (hdp + kLanes - 1) / kLanes * kLanes;  // pairs per key in `pairs`
  thread_local std::vector<uint32_t> pairs;  // [kBf16KeyBlock, row]: one block's keys as pairs
  pairs.resize(static_cast<size_t>(kBf16KeyBlock) * row);
  uint32_t* out = reinterpret_cast<uint32_t*>(packed);
  for (int b = 0; b < n_blocks; ++b) {
    const int in_block = std::min(kBf16KeyBlock, n_keys - b * kBf16KeyBlock);
    for (int jj = 0; jj < kBf16KeyBlock; ++jj) {
      uint32_t* dst = pairs.data() + jj * row;
      if (jj >= in_block) {
        std::fill_n(dst, hdp, 0u);
        continue;
      }
      ToPairs(k + (static_cast<int64_t>(b) * kBf16KeyBlock + jj) * k_stride, hd, dst);
    }
    uint32_t* ob = out + static_cast<int64_t>(b) * hdp * kBf16KeyBlock;
    const __m512i idx =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(row));
    int dp = 0;
    for (; dp + 16 <= hdp; dp += 16) {
      kernels_internal::Transpose16x16(pairs.data() + dp, row, ob + dp * kBf16KeyBlock);
    }
    for (; dp < hdp; ++dp) {
      _mm512_storeu_si512(ob + dp * kBf16KeyBlock,
                          _mm512_i32gather_epi32(idx, pairs.data() + dp, 4));
    }
  }
}

KV_BF16_ATTR void PackValuesBf16Impl(const float* v, int64_t v_stride, int n_keys, int pair_begin,
                                     int pair_end, int hd, uint16_t* packed) {
  const int width = Bf16ValueWidth(hd);
  // Word 2l of the result from word l of the conversion (the even key), 2l + 1 from word 16 + l.
  alignas(64) uint16_t order[32];
  for (int l = 0; l < kLanes; ++l) {
    order[2 * l] = static_cast<uint16_t>(l);
    order[2 * l + 1] = static_cast<uint16_t>(kLanes + l);
  }
  const __m512i interleave = _mm512_load_si512(order);
  for (int i = pair_begin; i < pair_end; ++i) {
    const float* even = v + static_cast<int64_t>(2 * i) * v_stride;
    const bool has_odd = 2 * i + 1 < n_keys;
    uint16_t* dst = packed + static_cast<int64_t>(i) * 2 * width;
    for (int d = 0; d < width; d += kLanes) {
      const __mmask16 m = LaneRange(0, hd - d);
      const __m512 lo = _mm512_maskz_loadu_ps(m, even + d);
      const __m512 hi =
          has_odd ? _mm512_maskz_loadu_ps(m, even + v_stride + d) : _mm512_setzero_ps();
      const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
      _mm512_storeu_si512(dst + 2 * d, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

KV_BF16_ATTR void KeyScoresBf16Impl(const float* q, int64_t q_stride, int n_rows,
                                    const uint16_t* packed, int b0, int b1, int hd, float scale,
                                    float* s, int64_t s_stride) {
  const int hdp = (hd + 1) / 2;
  const int row = (hdp + kLanes - 1) / kLanes * kLanes;
  thread_local std::vector<uint32_t> qp;  // [n_rows, row] the queries as bf16 pairs
  qp.resize(static_cast<size_t>(n_rows) * row);
  for (int r = 0; r < n_rows; ++r) ToPairs(q + r * q_stride, hd, qp.data() + r * row);
  int r = 0;
  for (; r + 4 <= n_rows; r += 4) {
    ScoreRows<4>(qp.data() + r * row, row, hdp, packed, b0, b1, scale, s + r * s_stride, s_stride);
  }
  for (; r < n_rows; ++r) {
    ScoreRows<1>(qp.data() + r * row, row, hdp, packed, b0, b1, scale, s + r * s_stride, s_stride);
  }
}

// exp(x) for x <= 0 (to f32 precision within a few ulp; 0 below -126): 2^n * 2^f with
// x log2(e) = n + f, |f| <= 1/2, 2^f by its Taylor polynomial of degree 6 in f ln 2.
KV_BF16_INLINE __m512 ExpNonPositive(__m512 x) {
  const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-126.0f)),
                                 _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 y = _mm512_set1_ps(1.5403530393381610e-4f);  // ln2^6 / 6!
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.3333558146428443e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.6181291076284772e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.5504108664821580e-2f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.4022650695910071e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.9314718055994531e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

KV_BF16_ATTR void SoftmaxBf16Impl(const float* s, int64_t s_stride, int n_rows, int j0, int j1,
                                  uint32_t* w, int64_t w_stride, float* inv_sum) {
  const int i0 = j0 / 2, n_pairs = (j1 + 1) / 2 - i0;
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int r = 0; r < n_rows; ++r) {
    const float* sr = s + r * s_stride + 2 * i0;   // key 2 * i0 at sr[0]
    const int lo = j0 - 2 * i0, hi = j1 - 2 * i0;  // the row's keys: sr[lo, hi)
    __m512 vmax = ninf;
    for (int j = 0; j < hi; j += kLanes) {
      vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(ninf, LaneRange(lo - j, hi - j), sr + j));
    }
    const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 sum = _mm512_setzero_ps();
    uint32_t* wr = w + r * w_stride;
    for (int i = 0; i < n_pairs; i += kLanes) {
      const int j = 2 * i;
      const __mmask16 m0 = LaneRange(lo - j, hi - j),
                      m1 = LaneRange(lo - j - kLanes, hi - j - kLanes);
      const __m512 e0 = _mm512_maskz_mov_ps(
          m0, ExpNonPositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m0, sr + j), max)));
      const __m512 e1 = _mm512_maskz_mov_ps(
          m1, ExpNonPositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m1, sr + j + kLanes), max)));
      const __m512i pairs = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(e1, e0));
      const __mmask16 keep = LaneRange(0, n_pairs - i);
      _mm512_mask_storeu_epi32(wr + i, keep, pairs);
      // The sum of the weights as rounded: the even key of each pair, then the odd one.
      const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
      const __m512 odd = _mm512_castsi512_ps(
          _mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
      sum = _mm512_add_ps(sum, _mm512_add_ps(even, odd));
    }
    inv_sum[r] = static_cast<float>(1.0 / static_cast<double>(_mm512_reduce_add_ps(sum)));
  }
}

KV_BF16_ATTR void WeightedValuesBf16Impl(const uint32_t* w, int64_t w_stride, int n_rows, int j0,
                                         int j1, const uint16_t* packed, int hd,
                                         const float* row_scale, float* out, int64_t o_stride) {
  const int i0 = j0 / 2, n_pairs = (j1 + 1) / 2 - i0;
  const uint16_t* vp = packed + static_cast<int64_t>(i0) * 2 * Bf16ValueWidth(hd);
  constexpr int kRows = 4;
  int r = 0;
  for (; r + kRows <= n_rows; r += kRows) {
    ValueRows<kRows>(w + r * w_stride, w_stride, n_pairs, vp, hd, row_scale + r, out + r * o_stride,
                     o_stride);
  }
  for (; r < n_rows; ++r) {
    ValueRows<1>(w + r * w_stride, w_stride, n_pairs, vp, hd, row_scale + r, out + r * o_stride,
                 o_stride);
  }
}

}  // namespace

void PackKeysBf16(const float* k, int64_t k_stride, int n_keys, int head_dim, uint16_t* packed) {
  PackKeysBf16Impl(k, k_stride, n_keys, head_dim, packed);
}

void PackValuesBf16(const float* v, int64_t v_stride, int n_keys, int pair_begin, int pair_end,
                    int head_dim, uint16_t* packed) {
  PackValuesBf16Impl(v, v_stride, n_keys, pair_begin, pair_end, head_dim, packed);
}

void KeyScoresBf16(const float* q, int64_t q_stride, int n_rows, const uint16_t* packed,
                   int block_begin, int block_end, int head_dim, float scale, float* scores,
                   int64_t s_stride) {
  KeyScoresBf16Impl(q, q_stride, n_rows, packed, block_begin, block_end, head_dim, scale, scores,
                    s_stride);
}

void SoftmaxBf16(const float* scores, int64_t s_stride, int n_rows, int j_begin, int j_end,
                 uint32_t* weights, int64_t w_stride, float* inv_sum) {
  SoftmaxBf16Impl(scores, s_stride, n_rows, j_begin, j_end, weights, w_stride, inv_sum);
}

void WeightedValuesBf16(const uint32_t* weights, int64_t w_stride, int n_rows, int j_begin,
                        int j_end, const uint16_t* packed, int head_dim, const float* row_scale,
                        float* out, int64_t o_stride) {
  WeightedValuesBf16Impl(weights, w_stride, n_rows, j_begin, j_end, packed, head_dim, row_scale,
                         out, o_stride);
}

#else  // !KV_HAVE_BF16_KERNELS

bool HaveBf16Attention() { return false; }

void PackKeysBf16(const float*, int64_t, int, int, uint16_t*) {
  KV_CHECK(false, "bf16 attention kernels are not in this build");
}
void PackValuesBf16(const float*, int64_t, int, int, int, int, uint16_t*) {
  KV_CHECK(false, "bf16 attention kernels are not in this build");
}
void KeyScoresBf16(const float*, int64_t, int, const uint16_t*, int, int, int, float, float*,
                   int64_t) {
  KV_CHECK(false, "bf16 attention kernels are not in this build");
}
void SoftmaxBf16(const float*, int64_t, int, int, int, uint32_t*, int64_t, float*) {
  KV_CHECK(false, "bf16 attention kernels are not in this build");
}
void WeightedValuesBf16(const uint32_t*, int64_t, int, int, int, const uint16_t*, int, const float*,
                        float*, int64_t) {
  KV_CHECK(false, "bf16 attention kernels are not in this build");
}

#endif  // KV_HAVE_BF16_KERNELS

}  // namespace kvasir
