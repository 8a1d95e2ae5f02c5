// AVX2 kernels for Q4_K, Q5_K and Q6_K weights x Q8_0 activations, for CPUs without AVX512-VNNI.
//
// Same scheme as matmul_vnni_k.cpp with eight rows per group (one per 32-bit lane of a 256-bit
// vector). vpmaddubsw (unsigned x signed bytes, pairs summed to int16) then vpmaddwd give each
// row's exact integer sums:
// - Q4_K: nibbles 0..15; pair sums <= 2 * 15 * 127, so all eight products add up in int16.
// - Q5_K: values 0..31; pair sums <= 2 * 31 * 127, four products at a time in int16.
// - Q6_K: the unsigned values u = q + 32 (0..63); two products stay within int16 (2 * 2 * 63 * 127
//   = 32004), and vpmaddwd with the sub-block scale (both int16 halves of the lane) applies it
//   exactly. The 32 of each half comes off in one more vpmaddwd: lane (32 * s0, 32 * s1) against
//   the token's (sum_lo, sum - sum_lo), so that isum = sum_h s_h * (sum u x - 32 * sum x) is the
//   reference's integer without a vpsignb per product.
// The f32 steps are those of IntBlockStep (quant_ints.h): bit-identical to ref::MatMul. One token
// (decode) reads the rows in row order and adds eight rows' partial sums together (DecodeGroup).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/check.h"
#include "kernels/matmul_panel.h"
#include "kernels/matmul_x86.h"

#if KV_HAVE_X86_KERNELS
#include <immintrin.h>
#endif

namespace kvasir::kernels_internal {

#if KV_HAVE_X86_KERNELS

#define KV_AVX2K_ATTR __attribute__((target("avx2,fma,f16c")))
#define KV_AVX2K_INLINE KV_AVX2K_ATTR inline __attribute__((always_inline))

namespace {

constexpr int kLanes = 8;
constexpr int kTileTokens = 4;  // tokens per register tile

enum class KFmt { kQ4K, kQ5K, kQ6K };

using AliasedI32 = int32_t __attribute__((may_alias));

// The per-row scales of one 32-value block of an 8-row group (lane r: row r).
struct alignas(32) KScale {
  float dw[kLanes];
  float dm[kLanes];    // Q4_K/Q5_K
  int32_t s0[kLanes];  // Q6_K sub-block scales, in both int16 halves
  int32_t s1[kLanes];
  int32_t s32[kLanes];  // Q6_K: 32 * s0 (low int16), 32 * s1 (high int16)
};

struct alignas(32) KBlock {
  uint8_t w[8][32];  // [k][row][4]: unsigned weights (Q6_K: q + 32)
  KScale s;
};

KV_AVX2K_INLINE __m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
KV_AVX2K_INLINE __m256i Sll16(__m256i v, int n) {
  return _mm256_sll_epi16(v, _mm_cvtsi32_si128(n));
}
KV_AVX2K_INLINE __m256i Srl16(__m256i v, int n) {
  return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n));
}
KV_AVX2K_INLINE __m256i Sll32(__m256i v, int n) {
  return _mm256_sll_epi32(v, _mm_cvtsi32_si128(n));
}
KV_AVX2K_INLINE __m256i Srl32(__m256i v, int n) {
  return _mm256_srl_epi32(v, _mm_cvtsi32_si128(n));
}
KV_AVX2K_INLINE __m256i Sra32(__m256i v, int n) {
  return _mm256_sra_epi32(v, _mm_cvtsi32_si128(n));
}

// Lane r of t[k] holds bytes 4k..4k+3 of the 32 bytes at p + r * rb (r < 8).
KV_AVX2K_INLINE void Transpose8x32(const uint8_t* p, size_t rb, __m256i t[8]) {
  __m256i z[8];
  for (int r = 0; r < 8; ++r) z[r] = Load256(p + r * rb);
  __m256i a[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm256_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
    a[2 * i + 1] = _mm256_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
  }
  __m256i c[8];
  for (int h = 0; h < 2; ++h) {
    c[4 * h + 0] = _mm256_unpacklo_epi64(a[4 * h + 0], a[4 * h + 2]);
    c[4 * h + 1] = _mm256_unpackhi_epi64(a[4 * h + 0], a[4 * h + 2]);
    c[4 * h + 2] = _mm256_unpacklo_epi64(a[4 * h + 1], a[4 * h + 3]);
    c[4 * h + 3] = _mm256_unpackhi_epi64(a[4 * h + 1], a[4 * h + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm256_permute2x128_si256(c[k], c[k + 4], 0x20);
    t[k + 4] = _mm256_permute2x128_si256(c[k], c[k + 4], 0x31);
  }
}

KV_AVX2K_INLINE __m256i Gather(const uint8_t* p, __m256i idx) {
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(p), idx, 1);
}

KV_AVX2K_INLINE __m256 HalfToFloat(__m256i low16) {
  const __m256i v = _mm256_and_si256(low16, _mm256_set1_epi32(0xFFFF));
  return _mm256_cvtph_ps(
      _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

// The per-row scales of the 8 blocks of the super-block at p (row r at lane r of idx); block j's
// go to the KScale `stride` bytes after block j - 1's.
template <KFmt F>
KV_AVX2K_INLINE void UnpackScales(const uint8_t* p, __m256i idx, KScale* first, size_t stride) {
  const auto out = [first, stride](int j) -> KScale& {
    return *reinterpret_cast<KScale*>(reinterpret_cast<uint8_t*>(first) + j * stride);
  };
  if constexpr (F == KFmt::kQ6K) {
    const __m256 d = HalfToFloat(Srl32(Gather(p + 206, idx), 16));
    for (int q = 0; q < 4; ++q) {
      const __m256i sc = Gather(p + 192 + 4 * q, idx);
      for (int h = 0; h < 2; ++h) {
        KScale& o = out(2 * q + h);
        const __m256i s0 = Sra32(Sll32(sc, 24 - 16 * h), 24);
        const __m256i s1 = Sra32(Sll32(sc, 16 - 16 * h), 24);
        // Both int16 halves carry the scale, for vpmaddwd.
        const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
        _mm256_store_si256(reinterpret_cast<__m256i*>(o.s0),
                           _mm256_or_si256(_mm256_and_si256(s0, lo16), _mm256_slli_epi32(s0, 16)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(o.s1),
                           _mm256_or_si256(_mm256_and_si256(s1, lo16), _mm256_slli_epi32(s1, 16)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(o.s32),
                           _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(s0, 5), lo16),
                                           _mm256_slli_epi32(s1, 21)));
        _mm256_store_ps(o.dw, d);
      }
    }
  } else {
    const __m256i g = Gather(p, idx);
    const __m256 d = HalfToFloat(g);
    const __m256 neg_dmin =
        _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(HalfToFloat(Srl32(g, 16))),
                                             _mm256_set1_epi32(static_cast<int32_t>(0x80000000u))));
    const __m256i d0 = Gather(p + 4, idx);
    const __m256i d1 = Gather(p + 8, idx);
    const __m256i d2 = Gather(p + 12, idx);
    const __m256i m63 = _mm256_set1_epi32(63);
    const __m256i m15 = _mm256_set1_epi32(15);
    const __m256i m3 = _mm256_set1_epi32(3);
    for (int j = 0; j < 8; ++j) {
      __m256i sc, mn;
      if (j < 4) {
        sc = _mm256_and_si256(Srl32(d0, 8 * j), m63);
        mn = _mm256_and_si256(Srl32(d1, 8 * j), m63);
      } else {
        const int i = j - 4;
        sc = _mm256_or_si256(_mm256_and_si256(Srl32(d2, 8 * i), m15),
                             _mm256_slli_epi32(_mm256_and_si256(Srl32(d0, 8 * i + 6), m3), 4));
        mn = _mm256_or_si256(_mm256_and_si256(Srl32(d2, 8 * i + 4), m15),
                             _mm256_slli_epi32(_mm256_and_si256(Srl32(d1, 8 * i + 6), m3), 4));
      }
      _mm256_store_ps(out(j).dw, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)));
      _mm256_store_ps(out(j).dm, _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(mn)));
    }
  }
}

template <KFmt F>
KV_AVX2K_INLINE void Unpack(const uint8_t* p, size_t rb, __m256i idx, KBlock out[8]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (F == KFmt::kQ6K) {
    const __m256i m30 = _mm256_set1_epi8(0x30);
    for (int n = 0; n < 2; ++n) {
      __m256i a[8], b[8], h[8];
      Transpose8x32(p + 64 * n, rb, a);
      Transpose8x32(p + 64 * n + 32, rb, b);
      Transpose8x32(p + 128 + 32 * n, rb, h);
      KBlock* o = out + 4 * n;
      for (int k = 0; k < 8; ++k) {
        __m256i v[4];
        v[0] = _mm256_or_si256(_mm256_and_si256(a[k], low4), _mm256_and_si256(Sll16(h[k], 4), m30));
        v[1] = _mm256_or_si256(_mm256_and_si256(b[k], low4), _mm256_and_si256(Sll16(h[k], 2), m30));
        v[2] = _mm256_or_si256(_mm256_and_si256(Srl16(a[k], 4), low4), _mm256_and_si256(h[k], m30));
        v[3] = _mm256_or_si256(_mm256_and_si256(Srl16(b[k], 4), low4),
                               _mm256_and_si256(Srl16(h[k], 2), m30));
        for (int c = 0; c < 4; ++c) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(o[c].w[k]), v[c]);
        }
      }
    }
  } else {
    constexpr bool kQ5 = F == KFmt::kQ5K;
    const uint8_t* qs = p + (kQ5 ? 48 : 16);
    __m256i hb[8];
    if constexpr (kQ5) Transpose8x32(p + 16, rb, hb);
    const __m256i m10 = _mm256_set1_epi8(0x10);
    for (int c = 0; c < 4; ++c) {
      __m256i t[8];
      Transpose8x32(qs + 32 * c, rb, t);
      for (int k = 0; k < 8; ++k) {
        __m256i lo = _mm256_and_si256(t[k], low4);
        __m256i hi = _mm256_and_si256(Srl16(t[k], 4), low4);
        if constexpr (kQ5) {
          const __m256i h0 = 2 * c <= 4 ? Sll16(hb[k], 4 - 2 * c) : Srl16(hb[k], 2 * c - 4);
          const __m256i h1 = 2 * c + 1 <= 4 ? Sll16(hb[k], 3 - 2 * c) : Srl16(hb[k], 2 * c - 3);
          lo = _mm256_or_si256(lo, _mm256_and_si256(h0, m10));
          hi = _mm256_or_si256(hi, _mm256_and_si256(h1, m10));
        }
        _mm256_store_si256(reinterpret_cast<__m256i*>(out[2 * c].w[k]), lo);
        _mm256_store_si256(reinterpret_cast<__m256i*>(out[2 * c + 1].w[k]), hi);
      }
    }
  }
  UnpackScales<F>(p, idx, &out[0].s, sizeof(KBlock));
}

// spair: Q6_K only, the token's (sum_lo, sum - sum_lo) as the low and high int16 of a lane.
template <KFmt F>
KV_AVX2K_INLINE __m256 Step(const KBlock& blk, const int8_t* xb, float dx, float fsum,
                            int32_t spair, __m256 acc) {
  const auto* xd = reinterpret_cast<const AliasedI32*>(xb);
  const auto* w = reinterpret_cast<const __m256i*>(blk.w);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i isum;
  if constexpr (F == KFmt::kQ6K) {
    __m256i q[4];  // products of k = 2j, 2j + 1, in int16
    for (int j = 0; j < 4; ++j) {
      q[j] = _mm256_add_epi16(
          _mm256_maddubs_epi16(_mm256_load_si256(w + 2 * j), _mm256_set1_epi32(xd[2 * j])),
          _mm256_maddubs_epi16(_mm256_load_si256(w + 2 * j + 1), _mm256_set1_epi32(xd[2 * j + 1])));
    }
    const __m256i s0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(blk.s.s0));
    const __m256i s1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(blk.s.s1));
    const __m256i lo = _mm256_add_epi32(_mm256_madd_epi16(q[0], s0), _mm256_madd_epi16(q[1], s0));
    const __m256i hi = _mm256_add_epi32(_mm256_madd_epi16(q[2], s1), _mm256_madd_epi16(q[3], s1));
    const __m256i off = _mm256_madd_epi16(
        _mm256_load_si256(reinterpret_cast<const __m256i*>(blk.s.s32)), _mm256_set1_epi32(spair));
    isum = _mm256_sub_epi32(_mm256_add_epi32(lo, hi), off);
  } else if constexpr (F == KFmt::kQ4K) {
    __m256i p = _mm256_maddubs_epi16(_mm256_load_si256(w), _mm256_set1_epi32(xd[0]));
    for (int k = 1; k < 8; ++k) {
      p = _mm256_add_epi16(
          p, _mm256_maddubs_epi16(_mm256_load_si256(w + k), _mm256_set1_epi32(xd[k])));
    }
    isum = _mm256_madd_epi16(p, ones);
  } else {
    __m256i p[2];
    for (int h = 0; h < 2; ++h) {
      p[h] = _mm256_maddubs_epi16(_mm256_load_si256(w + 4 * h), _mm256_set1_epi32(xd[4 * h]));
      for (int k = 4 * h + 1; k < 4 * h + 4; ++k) {
        p[h] = _mm256_add_epi16(
            p[h], _mm256_maddubs_epi16(_mm256_load_si256(w + k), _mm256_set1_epi32(xd[k])));
      }
    }
    isum = _mm256_add_epi32(_mm256_madd_epi16(p[0], ones), _mm256_madd_epi16(p[1], ones));
  }
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                        _mm256_mul_ps(_mm256_load_ps(blk.s.dw), _mm256_set1_ps(dx)), acc);
  if constexpr (F != KFmt::kQ6K)
    acc = _mm256_fmadd_ps(_mm256_load_ps(blk.s.dm), _mm256_set1_ps(fsum), acc);
  return acc;
}

// The (sum_lo, sum - sum_lo) int16 pair of a token's block (|sums of 16| <= 16 * 127).
KV_AVX2K_INLINE int32_t SumPair(int32_t sum, int32_t sum_lo) {
  return static_cast<int32_t>((static_cast<uint32_t>(sum_lo) & 0xFFFFu) |
                              static_cast<uint32_t>(sum - sum_lo) << 16);
}

KV_AVX2K_INLINE __m256i GatherIndex(size_t row_bytes) {
  return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                            _mm256_set1_epi32(static_cast<int32_t>(row_bytes)));
}

KV_AVX2K_INLINE void StoreRows(float* y, __m256 v, int64_t nr) {
  if (nr >= kLanes) {
    _mm256_storeu_ps(y, v);
    return;
  }
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(nr)), lane), v);
}

// One token, rows in row order (the twin of matmul_vnni_k.cpp's): each row's block is one 32-byte
// vector read with contiguous loads, vpmaddubsw against the token's 32 values leaves 16 int16 pair
// sums, and eight rows' sums are added and transposed together: each unpack step adds two
// partials of one row and moves one bit of the row index into the lane index, so that each block
// (Q6_K: sub-block) ends as one vector with row r in lane r. The int16 steps stay exact: Q4_K/Q5_K
// add eight products (<= 8 * 31 * 127), Q6_K four (<= 4 * 63 * 127) before vpmaddwd widens them.

// Blocks (b0, b1) of pair c of one row's super-block at p, as unsigned bytes. Q4_K/Q5_K: b0 = 2c,
// b1 = 2c + 1 (the two nibbles of qs[32c..32c+32)); Q6_K: b0 = 4n + e, b1 = 4n + e + 2 with
// n = c / 2, e = c % 2 (the two nibbles of ql[64n + 32e..]).
constexpr int PairBlock(KFmt f, int c, int h) {
  return f == KFmt::kQ6K ? 4 * (c / 2) + c % 2 + 2 * h : 2 * c + h;
}

template <KFmt F>
KV_AVX2K_INLINE void PairWeights(const uint8_t* p, int c, __m256i w[2]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (F == KFmt::kQ6K) {
    const int n = c / 2;
    const __m256i ql = Load256(p + 64 * n + 32 * (c % 2));
    const __m256i qh = Load256(p + 128 + 32 * n);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    // Sub-block column e (e + 2) takes qh bits 2e, 2e + 1 (2e + 4, 2e + 5) to bits 4, 5.
    const __m256i h0 = c % 2 == 0 ? _mm256_slli_epi16(qh, 4) : _mm256_slli_epi16(qh, 2);
    const __m256i h1 = c % 2 == 0 ? qh : _mm256_srli_epi16(qh, 2);
    w[0] = _mm256_or_si256(_mm256_and_si256(ql, low4), _mm256_and_si256(h0, m30));
    w[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql, 4), low4),
                           _mm256_and_si256(h1, m30));
  } else {
    constexpr bool kQ5 = F == KFmt::kQ5K;
    const __m256i q = Load256(p + (kQ5 ? 48 : 16) + 32 * c);
    w[0] = _mm256_and_si256(q, low4);
    w[1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    if constexpr (kQ5) {
      // Bit j of qh[l] is the 5th bit of block j: move bits 2c, 2c + 1 to bit 4.
      const __m256i qh = Load256(p + 16);
      const __m256i m10 = _mm256_set1_epi8(0x10);
      const __m256i h0 = 2 * c <= 4 ? Sll16(qh, 4 - 2 * c) : Srl16(qh, 2 * c - 4);
      const __m256i h1 = 2 * c + 1 <= 4 ? Sll16(qh, 3 - 2 * c) : Srl16(qh, 2 * c - 3);
      w[0] = _mm256_or_si256(w[0], _mm256_and_si256(h0, m10));
      w[1] = _mm256_or_si256(w[1], _mm256_and_si256(h1, m10));
    }
  }
}

// Rows r, r + 1: int32-unit bit 0 (of each 128-bit lane) becomes the row's bit 0.
template <KFmt F>
KV_AVX2K_INLINE void PairRows2(const uint8_t* p, size_t rb, int c, const __m256i x[2],
                               __m256i out[2]) {
  __m256i a[2], b[2];
  PairWeights<F>(p, c, a);
  PairWeights<F>(p + rb, c, b);
  for (int h = 0; h < 2; ++h) {
    a[h] = _mm256_maddubs_epi16(a[h], x[h]);
    b[h] = _mm256_maddubs_epi16(b[h], x[h]);
    out[h] = _mm256_add_epi16(_mm256_unpacklo_epi32(a[h], b[h]), _mm256_unpackhi_epi32(a[h], b[h]));
  }
}

// Rows r..r + 3, widened to int32: lane bits 0, 1 of each 128-bit lane are the row's bits 0, 1.
template <KFmt F>
KV_AVX2K_INLINE void PairRows4(const uint8_t* p, size_t rb, int c, const __m256i x[2],
                               __m256i out[2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i a[2], b[2];
  PairRows2<F>(p, rb, c, x, a);
  PairRows2<F>(p + 2 * rb, rb, c, x, b);
  for (int h = 0; h < 2; ++h) {
    if constexpr (F == KFmt::kQ6K) {
      const __m256i wa = _mm256_madd_epi16(a[h], ones);
      const __m256i wb = _mm256_madd_epi16(b[h], ones);
      out[h] = _mm256_add_epi32(_mm256_unpacklo_epi64(wa, wb), _mm256_unpackhi_epi64(wa, wb));
    } else {
      out[h] = _mm256_madd_epi16(
          _mm256_add_epi16(_mm256_unpacklo_epi64(a[h], b[h]), _mm256_unpackhi_epi64(a[h], b[h])),
          ones);
    }
  }
}

// Eight rows, row r in lane r. Q4_K/Q5_K: sums[PairBlock(c, h)] is block PairBlock(c, h);
// Q6_K: sums[2 * j], sums[2 * j + 1] are the two sub-blocks of block j.
template <KFmt F>
KV_AVX2K_INLINE void PairRows8(const uint8_t* p, size_t rb, int c, const int8_t* xs,
                               __m256i* sums) {
  __m256i x[2], a[2], b[2];
  for (int h = 0; h < 2; ++h)
    x[h] = Load256(reinterpret_cast<const uint8_t*>(xs) + 32 * PairBlock(F, c, h));
  PairRows4<F>(p, rb, c, x, a);
  PairRows4<F>(p + 4 * rb, rb, c, x, b);
  for (int h = 0; h < 2; ++h) {
    const __m256i lo = _mm256_permute2x128_si256(a[h], b[h], 0x20);
    const __m256i hi = _mm256_permute2x128_si256(a[h], b[h], 0x31);
    const int j = PairBlock(F, c, h);
    if constexpr (F == KFmt::kQ6K) {
      sums[2 * j] = lo;
      sums[2 * j + 1] = hi;
    } else {
      sums[j] = _mm256_add_epi32(lo, hi);
    }
  }
}

// One token (acts of a one-token batch) against a group streamed from the weights.
template <KFmt F>
KV_AVX2K_ATTR void DecodeGroup(const GroupSource& src, int64_t n_super, const QuantActs& acts,
                               const GroupPrefetcher& prefetch, float* y, int64_t nr) {
  const __m256i idx = GatherIndex(src.row_bytes);
  KScale scales[8];
  __m256 acc = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch.Block(sb);
    const uint8_t* p = src.base + sb * src.block_bytes;
    __m256i sums[F == KFmt::kQ6K ? 16 : 8];
    for (int c = 0; c < 4; ++c) PairRows8<F>(p, src.row_bytes, c, acts.qs + sb * kSuperBlock, sums);
    UnpackScales<F>(p, idx, scales, sizeof(KScale));
    for (int j = 0; j < 8; ++j) {
      const int64_t b = 8 * sb + j;
      const KScale& s = scales[j];
      __m256i isum;
      if constexpr (F == KFmt::kQ6K) {
        // s0, s1 sit in both int16 halves of their lanes: the high half, sign-extended.
        const auto* sv = reinterpret_cast<const __m256i*>(s.s0);
        const __m256i s0 = _mm256_srai_epi32(_mm256_load_si256(sv), 16);
        const __m256i s1 =
            _mm256_srai_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(s.s1)), 16);
        const __m256i off =
            _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(s.s32)),
                              _mm256_set1_epi32(SumPair(acts.sum[b], acts.sum_lo[b])));
        isum = _mm256_sub_epi32(_mm256_add_epi32(_mm256_mullo_epi32(sums[2 * j], s0),
                                                 _mm256_mullo_epi32(sums[2 * j + 1], s1)),
                                off);
      } else {
        isum = sums[j];
      }
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                            _mm256_mul_ps(_mm256_load_ps(s.dw), _mm256_set1_ps(acts.d[b])), acc);
      if constexpr (F != KFmt::kQ6K) {
        acc = _mm256_fmadd_ps(_mm256_load_ps(s.dm), _mm256_set1_ps(acts.fsum[b]), acc);
      }
    }
  }
  StoreRows(y, acc, nr);
}

template <KFmt F>
KV_AVX2K_ATTR void PackPanel(const GroupSource& src, int64_t n_super,
                             const GroupPrefetcher& prefetch, KBlock* panel) {
  const __m256i idx = GatherIndex(src.row_bytes);
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch.Block(sb);
    Unpack<F>(src.base + sb * src.block_bytes, src.row_bytes, idx, panel + 8 * sb);
  }
}

// T tokens of a tile whose blocks hold `stride` tokens (qs, d, fsum at the first token).
template <KFmt F, int T>
KV_AVX2K_ATTR void PanelTile(const KBlock* panel, int64_t nb, const int8_t* qs, const float* d,
                             const float* fsum, const int32_t* sum, const int32_t* sum_lo,
                             int64_t stride, float* y, int64_t ld, int64_t nr) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t slot = b * stride + t;
      const int32_t spair = F == KFmt::kQ6K ? SumPair(sum[slot], sum_lo[slot]) : 0;
      acc[t] = Step<F>(panel[b], qs + slot * kQBlock, d[slot], fsum[slot], spair, acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) StoreRows(y + t * ld, acc[t], nr);
}

template <KFmt F>
void RunRows(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
             int64_t row_end, size_t block_bytes) {
  KV_CHECK(w.row_bytes * (kLanes - 1) + 256 < (size_t{1} << 31), "row stride {} too large",
           w.row_bytes);
  const int64_t n_super = w.cols / kSuperBlock;
  const int64_t nb = w.cols / kQBlock;
  const auto* data = static_cast<const uint8_t*>(w.data);
  for (int64_t g0 = row_begin; g0 < row_end; g0 += kLanes) {
    const int64_t nr = std::min<int64_t>(kLanes, row_end - g0);
    GroupSource src{data + static_cast<size_t>(g0) * w.row_bytes, w.row_bytes, block_bytes};
    if (nr < kLanes) {
      const size_t row_bytes = static_cast<size_t>(n_super) * block_bytes;
      auto* rows = static_cast<uint8_t*>(ThreadTailScratch().Get(kLanes * row_bytes));
      std::memset(rows, 0, kLanes * row_bytes);
      for (int64_t r = 0; r < nr; ++r) {
        std::memcpy(rows + r * row_bytes, src.base + static_cast<size_t>(r) * w.row_bytes,
                    row_bytes);
      }
      src = GroupSource{rows, row_bytes, block_bytes};
    }
    const int64_t next_rows = std::min<int64_t>(kLanes, row_end - g0 - kLanes);
    const GroupPrefetcher prefetch(
        next_rows > 0 ? data + static_cast<size_t>(g0 + kLanes) * w.row_bytes : nullptr,
        static_cast<size_t>(std::max<int64_t>(next_rows, 0)) * w.row_bytes, n_super);
    if (acts.n_tokens == 1) {
      DecodeGroup<F>(src, n_super, acts, prefetch, y + g0, nr);
      continue;
    }
    auto* panel =
        static_cast<KBlock*>(ThreadPanelScratch().Get(static_cast<size_t>(nb) * sizeof(KBlock)));
    PackPanel<F>(src, n_super, prefetch, panel);
    for (int64_t t0 = 0; t0 < acts.n_tokens; t0 += kActTile) {
      const int64_t nt = ActTileTokens(acts.n_tokens, t0);
      for (int64_t t1 = 0; t1 < nt; t1 += kTileTokens) {
        const int64_t n = std::min<int64_t>(kTileTokens, nt - t1);
        const int8_t* q = acts.qs + t0 * acts.cols + t1 * kQBlock;
        const float* d = acts.d + t0 * nb + t1;
        const float* fs = acts.fsum + t0 * nb + t1;
        const int32_t* su = acts.sum + t0 * nb + t1;
        const int32_t* sl = acts.sum_lo + t0 * nb + t1;
        float* yt = y + (t0 + t1) * w.rows + g0;
        switch (n) {
          case 4:
            PanelTile<F, 4>(panel, nb, q, d, fs, su, sl, nt, yt, w.rows, nr);
            break;
          case 3:
            PanelTile<F, 3>(panel, nb, q, d, fs, su, sl, nt, yt, w.rows, nr);
            break;
          case 2:
            PanelTile<F, 2>(panel, nb, q, d, fs, su, sl, nt, yt, w.rows, nr);
            break;
          default:
            PanelTile<F, 1>(panel, nb, q, d, fs, su, sl, nt, yt, w.rows, nr);
            break;
        }
      }
    }
  }
}

}  // namespace

void MatMulKQuantRowsAvx2(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                          int64_t row_end) {
  switch (w.type) {
    case TensorType::kQ4_K:
      RunRows<KFmt::kQ4K>(w, acts, y, row_begin, row_end, sizeof(BlockQ4_K));
      return;
    case TensorType::kQ5_K:
      RunRows<KFmt::kQ5K>(w, acts, y, row_begin, row_end, sizeof(BlockQ5_K));
      return;
    case TensorType::kQ6_K:
      RunRows<KFmt::kQ6K>(w, acts, y, row_begin, row_end, sizeof(BlockQ6_K));
      return;
    default:
      KV_CHECK(false, "AVX2 K-quant kernel: type {}", static_cast<uint32_t>(w.type));
  }
}

#else  // !KV_HAVE_X86_KERNELS

void MatMulKQuantRowsAvx2(const MatrixView&, const QuantActs&, float*, int64_t, int64_t) {
  KV_CHECK(false, "x86 kernels are not built for this architecture");
}

#endif  // KV_HAVE_X86_KERNELS

}  // namespace kvasir::kernels_internal
