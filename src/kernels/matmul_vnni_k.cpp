// AVX-512 VNNI kernels for Q4_K, Q5_K and Q6_K weights x Q8_0 activations.
//
// As in matmul_vnni.cpp, sixteen rows go together, one per 32-bit lane. Each 256-value super-block
// of the 16 rows is unpacked into eight 32-value blocks (KBlock): vectors W[k] whose lane r holds
// the unsigned weights 4k..4k+3 of row r (Q4_K 0..15, Q5_K 0..31, Q6_K q + 32 in 0..63), plus the
// per-lane scales of the integer form (quant_ints.h): dw (Q4_K/Q5_K d * sc, Q6_K d), dm (Q4_K/Q5_K
// -(dmin * m)) and Q6_K's two integer sub-block scales. vpdpbusd then gives exact integer sums,
// and the f32 steps are exactly those of IntBlockStep:
//   Q4_K/Q5_K: acc = fma(float(isum), dw * dx, acc); acc = fma(dm, fsum, acc)
//   Q6_K:      isum = s0 * (dot_lo - 32 sum_lo) + s1 * (dot_hi - 32 (sum - sum_lo));
//              acc = fma(float(isum), dw * dx, acc)
// so the results equal ref::MatMul bit for bit.
//
// One token (decode) reads each row's super-blocks in row order instead (DecodeGroupRowOrder):
// for one token the unpacking above would be most of the work. Small batches (2 to kMaxBatch
// tokens) unpack each super-block of a group into a small buffer that stays in L1 and apply it to
// every token, reading the weights once; prefill unpacks a whole 16-row panel once into
// thread-local memory and runs every tile of up to kActTile tokens on it.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "base/check.h"
#include "kernels/matmul_panel.h"
#include "kernels/matmul_x86.h"

#if KV_HAVE_X86_KERNELS
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, see matmul_vnni.cpp
#endif
#include <immintrin.h>
#endif

namespace kvasir::kernels_internal {

#if KV_HAVE_X86_KERNELS

#define KV_VNNIK_ATTR \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#define KV_VNNIK_INLINE KV_VNNIK_ATTR inline __attribute__((always_inline))

namespace {

constexpr int kLanes = 16;
constexpr int kMaxBatch = 8;

enum class KFmt { kQ4K, kQ5K, kQ6K };

using AliasedI32 = int32_t __attribute__((may_alias));

// The per-row scales of one 32-value block of a 16-row group (lane r: row r).
struct alignas(64) KScale {
  float dw[kLanes];
  float dm[kLanes];    // Q4_K/Q5_K
  int32_t s0[kLanes];  // Q6_K sub-block scales
  int32_t s1[kLanes];
};

// One 32-value block of a 16-row group, unpacked.
struct alignas(64) KBlock {
  uint8_t w[8][64];  // [k][row][4] unsigned weights
  KScale s;
};
static_assert(sizeof(KBlock) == 12 * 64);

KV_VNNIK_INLINE __m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Transposes 32 bytes at p + r * rb (r < 16): lane r of t[k] holds bytes 4k..4k+3 of row r.
KV_VNNIK_INLINE void Transpose16x32(const uint8_t* p, size_t rb, __m512i t[8]) {
  // 256-bit half m of z[j] holds row 4m + j (j < 4) or 8 + 4m + (j - 4) (j >= 4), so that the
  // final 128-bit lane shuffle leaves the rows in order.
  __m512i z[8];
  for (int j = 0; j < 8; ++j) {
    const int r0 = j < 4 ? j : j + 4;
    z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(Load256(p + r0 * rb)),
                              Load256(p + (r0 + 4) * rb), 1);
  }
  __m512i a[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
  }
  __m512i c[8];
  for (int h = 0; h < 2; ++h) {
    c[4 * h + 0] = _mm512_unpacklo_epi64(a[4 * h + 0], a[4 * h + 2]);
    c[4 * h + 1] = _mm512_unpackhi_epi64(a[4 * h + 0], a[4 * h + 2]);
    c[4 * h + 2] = _mm512_unpacklo_epi64(a[4 * h + 1], a[4 * h + 3]);
    c[4 * h + 3] = _mm512_unpackhi_epi64(a[4 * h + 1], a[4 * h + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm512_shuffle_i32x4(c[k], c[k + 4], _MM_SHUFFLE(2, 0, 2, 0));
    t[k + 4] = _mm512_shuffle_i32x4(c[k], c[k + 4], _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// Shifts by a count that may not be a compile-time constant (folded to immediates when it is).
KV_VNNIK_INLINE __m512i Sll16(__m512i v, int n) {
  return _mm512_sll_epi16(v, _mm_cvtsi32_si128(n));
}
KV_VNNIK_INLINE __m512i Srl16(__m512i v, int n) {
  return _mm512_srl_epi16(v, _mm_cvtsi32_si128(n));
}
KV_VNNIK_INLINE __m512i Sll32(__m512i v, int n) {
  return _mm512_sll_epi32(v, _mm_cvtsi32_si128(n));
}
KV_VNNIK_INLINE __m512i Srl32(__m512i v, int n) {
  return _mm512_srl_epi32(v, _mm_cvtsi32_si128(n));
}
KV_VNNIK_INLINE __m512i Sra32(__m512i v, int n) {
  return _mm512_sra_epi32(v, _mm_cvtsi32_si128(n));
}

KV_VNNIK_INLINE __m512i Gather(const uint8_t* p, __m512i idx) {
  return _mm512_i32gather_epi32(idx, p, 1);
}

KV_VNNIK_INLINE __m512 HalfToFloat(__m512i low16) {
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(low16));
}

// The per-row scales of the 8 blocks of the super-block at p (row r at lane r of idx); block j's
// go to the KScale `stride` bytes after block j - 1's.
template <KFmt F>
KV_VNNIK_INLINE void UnpackScales(const uint8_t* p, __m512i idx, KScale* first, size_t stride) {
  const auto out = [first, stride](int j) -> KScale& {
    return *reinterpret_cast<KScale*>(reinterpret_cast<uint8_t*>(first) + j * stride);
  };
  if constexpr (F == KFmt::kQ6K) {
    // d is the high half of the dword at 206; the int8 scales are dwords at 192..207.
    const __m512 d = HalfToFloat(_mm512_srli_epi32(Gather(p + 206, idx), 16));
    for (int q = 0; q < 4; ++q) {
      const __m512i sc = Gather(p + 192 + 4 * q, idx);  // scales 4q..4q+3: blocks 2q, 2q + 1
      for (int h = 0; h < 2; ++h) {
        KScale& o = out(2 * q + h);
        _mm512_store_si512(o.s0, Sra32(Sll32(sc, 24 - 16 * h), 24));
        _mm512_store_si512(o.s1, Sra32(Sll32(sc, 16 - 16 * h), 24));
        _mm512_store_ps(o.dw, d);
      }
    }
  } else {
    const __m512i g = Gather(p, idx);
    const __m512 d = HalfToFloat(g);
    const __m512 neg_dmin = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(HalfToFloat(_mm512_srli_epi32(g, 16))),
                         _mm512_set1_epi32(static_cast<int32_t>(0x80000000u))));
    const __m512i d0 = Gather(p + 4, idx);
    const __m512i d1 = Gather(p + 8, idx);
    const __m512i d2 = Gather(p + 12, idx);
    const __m512i m63 = _mm512_set1_epi32(63);
    const __m512i m15 = _mm512_set1_epi32(15);
    const __m512i m3 = _mm512_set1_epi32(3);
    for (int j = 0; j < 8; ++j) {
      __m512i sc, mn;
      if (j < 4) {
        sc = _mm512_and_si512(Srl32(d0, 8 * j), m63);
        mn = _mm512_and_si512(Srl32(d1, 8 * j), m63);
      } else {
        const int i = j - 4;
        sc = _mm512_or_si512(_mm512_and_si512(Srl32(d2, 8 * i), m15),
                             _mm512_slli_epi32(_mm512_and_si512(Srl32(d0, 8 * i + 6), m3), 4));
        mn = _mm512_or_si512(_mm512_and_si512(Srl32(d2, 8 * i + 4), m15),
                             _mm512_slli_epi32(_mm512_and_si512(Srl32(d1, 8 * i + 6), m3), 4));
      }
      // Both products are exact (11-bit by 6-bit); -(dmin * m) == (-dmin) * m.
      _mm512_store_ps(out(j).dw, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
      _mm512_store_ps(out(j).dm, _mm512_mul_ps(neg_dmin, _mm512_cvtepi32_ps(mn)));
    }
  }
}

// Unpacks the super-block at p (row 0; row r at p + r * rb) into out[0..8).
template <KFmt F>
KV_VNNIK_INLINE void Unpack(const uint8_t* p, size_t rb, __m512i idx, KBlock out[8]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  if constexpr (F == KFmt::kQ6K) {
    const __m512i m30 = _mm512_set1_epi8(0x30);
    for (int n = 0; n < 2; ++n) {
      __m512i a[8], b[8], h[8];
      Transpose16x32(p + 64 * n, rb, a);
      Transpose16x32(p + 64 * n + 32, rb, b);
      Transpose16x32(p + 128 + 32 * n, rb, h);
      KBlock* o = out + 4 * n;
      for (int k = 0; k < 8; ++k) {
        const __m512i v0 = _mm512_or_si512(_mm512_and_si512(a[k], low4),
                                           _mm512_and_si512(_mm512_slli_epi16(h[k], 4), m30));
        const __m512i v1 = _mm512_or_si512(_mm512_and_si512(b[k], low4),
                                           _mm512_and_si512(_mm512_slli_epi16(h[k], 2), m30));
        const __m512i v2 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a[k], 4), low4),
                                           _mm512_and_si512(h[k], m30));
        const __m512i v3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b[k], 4), low4),
                                           _mm512_and_si512(_mm512_srli_epi16(h[k], 2), m30));
        _mm512_store_si512(o[0].w[k], v0);
        _mm512_store_si512(o[1].w[k], v1);
        _mm512_store_si512(o[2].w[k], v2);
        _mm512_store_si512(o[3].w[k], v3);
      }
    }
  } else {
    constexpr bool kQ5 = F == KFmt::kQ5K;
    const uint8_t* qs = p + (kQ5 ? 48 : 16);
    __m512i hb[8];
    if constexpr (kQ5) Transpose16x32(p + 16, rb, hb);
    const __m512i m10 = _mm512_set1_epi8(0x10);
    for (int c = 0; c < 4; ++c) {
      __m512i t[8];
      Transpose16x32(qs + 32 * c, rb, t);
      for (int k = 0; k < 8; ++k) {
        __m512i lo = _mm512_and_si512(t[k], low4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(t[k], 4), low4);
        if constexpr (kQ5) {
          // Bit 2c (2c + 1) of each qh byte is the 5th bit of block 2c (2c + 1): move it to bit 4.
          const __m512i h0 = 2 * c <= 4 ? Sll16(hb[k], 4 - 2 * c) : Srl16(hb[k], 2 * c - 4);
          const __m512i h1 = 2 * c + 1 <= 4 ? Sll16(hb[k], 3 - 2 * c) : Srl16(hb[k], 2 * c - 3);
          lo = _mm512_or_si512(lo, _mm512_and_si512(h0, m10));
          hi = _mm512_or_si512(hi, _mm512_and_si512(h1, m10));
        }
        _mm512_store_si512(out[2 * c].w[k], lo);
        _mm512_store_si512(out[2 * c + 1].w[k], hi);
      }
    }
  }
  UnpackScales<F>(p, idx, &out[0].s, sizeof(KBlock));
}

// One token's step on one block (xb: its 32 int8 values).
template <KFmt F>
KV_VNNIK_INLINE __m512 Step(const KBlock& blk, const int8_t* xb, float dx, int32_t sum,
                            int32_t sum_lo, float fsum, __m512 acc) {
  const auto* xd = reinterpret_cast<const AliasedI32*>(xb);
  if constexpr (F == KFmt::kQ6K) {
    __m512i lo = _mm512_set1_epi32(-32 * sum_lo);
    __m512i hi = _mm512_set1_epi32(-32 * (sum - sum_lo));
    for (int k = 0; k < 4; ++k) {
      lo = _mm512_dpbusd_epi32(lo, _mm512_load_si512(blk.w[k]), _mm512_set1_epi32(xd[k]));
      hi = _mm512_dpbusd_epi32(hi, _mm512_load_si512(blk.w[k + 4]), _mm512_set1_epi32(xd[k + 4]));
    }
    const __m512i isum = _mm512_add_epi32(_mm512_mullo_epi32(lo, _mm512_load_si512(blk.s.s0)),
                                          _mm512_mullo_epi32(hi, _mm512_load_si512(blk.s.s1)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum),
                           _mm512_mul_ps(_mm512_load_ps(blk.s.dw), _mm512_set1_ps(dx)), acc);
  } else {
    __m512i s0 = _mm512_setzero_si512();
    __m512i s1 = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
      s0 = _mm512_dpbusd_epi32(s0, _mm512_load_si512(blk.w[k]), _mm512_set1_epi32(xd[k]));
      s1 = _mm512_dpbusd_epi32(s1, _mm512_load_si512(blk.w[k + 1]), _mm512_set1_epi32(xd[k + 1]));
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                          _mm512_mul_ps(_mm512_load_ps(blk.s.dw), _mm512_set1_ps(dx)), acc);
    return _mm512_fmadd_ps(_mm512_load_ps(blk.s.dm), _mm512_set1_ps(fsum), acc);
  }
}

__mmask16 RowMask(int64_t n_rows) {
  return static_cast<__mmask16>(n_rows >= kLanes ? 0xFFFF : (1u << n_rows) - 1);
}

KV_VNNIK_INLINE __m512i GatherIndex(size_t row_bytes) {
  return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                            _mm512_set1_epi32(static_cast<int32_t>(row_bytes)));
}

// The activations of one tile of nt tokens (QuantActs layout, offsets of tile start applied).
struct TileActs {
  const int8_t* qs;
  const float* d;
  const int32_t* sum;
  const int32_t* sum_lo;
  const float* fsum;
  int64_t nt;
};

TileActs ActsTile(const QuantActs& acts, int64_t t0) {
  const int64_t nb = acts.cols / kQBlock;
  return TileActs{acts.qs + t0 * acts.cols, acts.d + t0 * nb,    acts.sum + t0 * nb,
                  acts.sum_lo + t0 * nb,    acts.fsum + t0 * nb, ActTileTokens(acts.n_tokens, t0)};
}

// NT tokens of a tile against blocks [0, n_blocks) of `blocks` (block b = activation block b0 + b).
template <KFmt F, int NT>
KV_VNNIK_INLINE void RunBlocks(const KBlock* blocks, int64_t n_blocks, const TileActs& a,
                               int64_t b0, __m512 acc[NT]) {
  for (int64_t b = 0; b < n_blocks; ++b) {
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
      const int64_t slot = (b0 + b) * a.nt + t;
      acc[t] = Step<F>(blocks[b], a.qs + slot * kQBlock, a.d[slot], a.sum[slot], a.sum_lo[slot],
                       a.fsum[slot], acc[t]);
    }
  }
}

template <KFmt F, int NT>
KV_VNNIK_ATTR void DecodeGroup(const GroupSource& src, int64_t n_super, const TileActs& a,
                               const GroupPrefetcher& prefetch, float* y, int64_t ld,
                               __mmask16 mask) {
  const __m512i idx = GatherIndex(src.row_bytes);
  KBlock blocks[8];
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch.Block(sb);
    Unpack<F>(src.base + sb * src.block_bytes, src.row_bytes, idx, blocks);
    RunBlocks<F, NT>(blocks, 8, a, 8 * sb, acc);
  }
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ld, mask, acc[t]);
}

// One token, rows in row order. Each row's super-block is read with contiguous loads; vpdpbusd
// against the token's values leaves, per 64 weights, 16 int32 partial sums (four products each):
// P[k], k < 4, of which lanes 8h..8h+7 belong to one 32-value block (Q4_K/Q5_K: P[0] blocks 0|2,
// P[1] 1|3, P[2] 4|6, P[3] 5|7) or lanes 4s..4s+3 to one 16-value sub-block (Q6_K: P[k] sub-blocks
// 4k..4k+3). Sixteen rows' partials are then added and transposed together: each unpack step adds
// two partials of one row and moves one bit of the row index into the lane index, so that the
// result holds, per block (sub-block), one vector with row r in lane r: the same exact integers
// as the transposed kernel, on which the same f32 steps follow.

// Q4_K/Q5_K: the pair of blocks of P[k]; Q6_K: P[k] holds blocks 2k, 2k + 1.
constexpr int kPairBlocks[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};

// The token's 256 values of one super-block, arranged as P[k]'s blocks.
template <KFmt F>
KV_VNNIK_INLINE void SuperBlockActs(const int8_t* x, __m512i xv[4]) {
  const __m512i a = _mm512_loadu_si512(x);        // blocks 0|1
  const __m512i b = _mm512_loadu_si512(x + 64);   // 2|3
  const __m512i c = _mm512_loadu_si512(x + 128);  // 4|5
  const __m512i d = _mm512_loadu_si512(x + 192);  // 6|7
  if constexpr (F == KFmt::kQ6K) {
    xv[0] = a;
    xv[1] = b;
    xv[2] = c;
    xv[3] = d;
  } else {
    xv[0] = _mm512_shuffle_i64x2(a, b, 0x44);
    xv[1] = _mm512_shuffle_i64x2(a, b, 0xEE);
    xv[2] = _mm512_shuffle_i64x2(c, d, 0x44);
    xv[3] = _mm512_shuffle_i64x2(c, d, 0xEE);
  }
}

KV_VNNIK_INLINE __m512i Counts16(int lo, int hi) {
  return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(lo)),
                            _mm256_set1_epi16(static_cast<int16_t>(hi)), 1);
}

// The partials P[0..4) of one row's super-block at p.
template <KFmt F>
KV_VNNIK_INLINE void RowPartials(const uint8_t* p, const __m512i xv[4], __m512i out[4]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i w[4];
  if constexpr (F == KFmt::kQ6K) {
    // ql[0..64) holds sub-blocks c = 0, 1 (low nibbles) and 2, 3 (high) of half n = 0; qh bits
    // 2c, 2c + 1 go to bits 4, 5 (shifted left 4 - 2c, or right 2 for c = 3).
    const __m512i m30 = _mm512_set1_epi8(0x30);
    for (int n = 0; n < 2; ++n) {
      const __m512i ql = _mm512_loadu_si512(p + 64 * n);
      const __m512i qh = _mm512_broadcast_i64x4(Load256(p + 128 + 32 * n));
      const __m512i lo = _mm512_and_si512(ql, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4);
      w[2 * n] = _mm512_ternarylogic_epi32(lo, _mm512_sllv_epi16(qh, Counts16(4, 2)), m30, 0xF8);
      w[2 * n + 1] =
          _mm512_ternarylogic_epi32(hi, _mm512_srlv_epi16(qh, Counts16(0, 2)), m30, 0xF8);
    }
  } else {
    constexpr bool kQ5 = F == KFmt::kQ5K;
    const uint8_t* qs = p + (kQ5 ? 48 : 16);
    for (int n = 0; n < 2; ++n) {
      const __m512i q = _mm512_loadu_si512(qs + 64 * n);
      w[2 * n] = _mm512_and_si512(q, low4);
      w[2 * n + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
    }
    if constexpr (kQ5) {
      // Bit j of qh[l] is the 5th bit of block j: move it to bit 4 of the byte.
      const __m512i m10 = _mm512_set1_epi8(0x10);
      const __m512i qh = _mm512_broadcast_i64x4(Load256(p + 16));
      w[0] = _mm512_ternarylogic_epi32(w[0], _mm512_sllv_epi16(qh, Counts16(4, 2)), m10, 0xF8);
      w[1] = _mm512_ternarylogic_epi32(w[1], _mm512_sllv_epi16(qh, Counts16(3, 1)), m10, 0xF8);
      w[2] = _mm512_ternarylogic_epi32(w[2], _mm512_srlv_epi16(qh, Counts16(0, 2)), m10, 0xF8);
      w[3] = _mm512_ternarylogic_epi32(w[3], _mm512_srlv_epi16(qh, Counts16(1, 3)), m10, 0xF8);
    }
  }
  for (int k = 0; k < 4; ++k) out[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[k], xv[k]);
}

// Rows r, r + 1 at p: lane bit 0 becomes the row's bit 0, partials that differed in lane bit 1
// are added.
template <KFmt F>
KV_VNNIK_INLINE void Rows2(const uint8_t* p, size_t rb, const __m512i xv[4], __m512i out[4]) {
  __m512i a[4], b[4];
  RowPartials<F>(p, xv, a);
  RowPartials<F>(p + rb, xv, b);
  for (int k = 0; k < 4; ++k) {
    out[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[k], b[k]), _mm512_unpackhi_epi32(a[k], b[k]));
  }
}

// Rows r..r + 3: lane bits 0, 1 are the row's bits 0, 1; each 128-bit lane holds one sum.
template <KFmt F>
KV_VNNIK_INLINE void Rows4(const uint8_t* p, size_t rb, const __m512i xv[4], __m512i out[4]) {
  __m512i a[4], b[4];
  Rows2<F>(p, rb, xv, a);
  Rows2<F>(p + 2 * rb, rb, xv, b);
  for (int k = 0; k < 4; ++k) {
    out[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[k], b[k]), _mm512_unpackhi_epi64(a[k], b[k]));
  }
}

constexpr int SumVectors(KFmt f) { return f == KFmt::kQ6K ? 16 : 8; }

// Rows r..r + 7: 128-bit lane bit 1 is the row's bit 2. Q4_K/Q5_K: out[k] adds the two halves of
// each block of P[k] (lane bit 0: which block); Q6_K: out[2k + i] holds sub-blocks 4k + i, 4k + 2 +
// i.
template <KFmt F>
KV_VNNIK_INLINE void Rows8(const uint8_t* p, size_t rb, const __m512i xv[4],
                           __m512i out[SumVectors(F) / 2]) {
  __m512i a[4], b[4];
  Rows4<F>(p, rb, xv, a);
  Rows4<F>(p + 4 * rb, rb, xv, b);
  for (int k = 0; k < 4; ++k) {
    const __m512i even = _mm512_shuffle_i32x4(a[k], b[k], 0x88);
    const __m512i odd = _mm512_shuffle_i32x4(a[k], b[k], 0xDD);
    if constexpr (F == KFmt::kQ6K) {
      out[2 * k] = even;
      out[2 * k + 1] = odd;
    } else {
      out[k] = _mm512_add_epi32(even, odd);
    }
  }
}

// Sixteen rows: sums[i] has row r in lane r. Q4_K/Q5_K: sums[2k + h] is block kPairBlocks[k][h];
// Q6_K: sums[4k + 2i + h] is sub-block 4k + i + 2h.
template <KFmt F>
KV_VNNIK_INLINE void Rows16(const uint8_t* p, size_t rb, const __m512i xv[4],
                            __m512i sums[SumVectors(F)]) {
  constexpr int kHalf = SumVectors(F) / 2;
  __m512i a[kHalf], b[kHalf];
  Rows8<F>(p, rb, xv, a);
  Rows8<F>(p + 8 * rb, rb, xv, b);
  for (int m = 0; m < kHalf; ++m) {
    sums[2 * m] = _mm512_shuffle_i32x4(a[m], b[m], 0x88);
    sums[2 * m + 1] = _mm512_shuffle_i32x4(a[m], b[m], 0xDD);
  }
}

// Where Rows16 leaves block j (Q4_K/Q5_K) or sub-block s (Q6_K).
constexpr int BlockSlot(int j) {
  for (int k = 0; k < 4; ++k) {
    for (int h = 0; h < 2; ++h) {
      if (kPairBlocks[k][h] == j) return 2 * k + h;
    }
  }
  return -1;
}
constexpr int SubBlockSlot(int s) { return 4 * (s / 4) + 2 * (s % 2) + (s % 4) / 2; }

template <KFmt F>
KV_VNNIK_ATTR void DecodeGroupRowOrder(const GroupSource& src, int64_t n_super, const TileActs& a,
                                       const GroupPrefetcher& prefetch, float* y, __mmask16 mask) {
  const __m512i idx = GatherIndex(src.row_bytes);
  __m512 acc = _mm512_setzero_ps();
  KScale scales[8];
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch.Block(sb);
    const uint8_t* p = src.base + sb * src.block_bytes;
    __m512i xv[4];
    SuperBlockActs<F>(a.qs + sb * kSuperBlock, xv);
    __m512i sums[SumVectors(F)];
    Rows16<F>(p, src.row_bytes, xv, sums);
    UnpackScales<F>(p, idx, scales, sizeof(KScale));
    for (int j = 0; j < 8; ++j) {
      const int64_t slot = 8 * sb + j;
      const KScale& s = scales[j];
      const __m512 scale = _mm512_mul_ps(_mm512_load_ps(s.dw), _mm512_set1_ps(a.d[slot]));
      if constexpr (F == KFmt::kQ6K) {
        const __m512i lo =
            _mm512_sub_epi32(sums[SubBlockSlot(2 * j)], _mm512_set1_epi32(32 * a.sum_lo[slot]));
        const __m512i hi = _mm512_sub_epi32(sums[SubBlockSlot(2 * j + 1)],
                                            _mm512_set1_epi32(32 * (a.sum[slot] - a.sum_lo[slot])));
        const __m512i isum = _mm512_add_epi32(_mm512_mullo_epi32(lo, _mm512_load_si512(s.s0)),
                                              _mm512_mullo_epi32(hi, _mm512_load_si512(s.s1)));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc);
      } else {
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[BlockSlot(j)]), scale, acc);
        acc = _mm512_fmadd_ps(_mm512_load_ps(s.dm), _mm512_set1_ps(a.fsum[slot]), acc);
      }
    }
  }
  _mm512_mask_storeu_ps(y, mask, acc);
}

template <KFmt F>
KV_VNNIK_ATTR void PackPanel(const GroupSource& src, int64_t n_super,
                             const GroupPrefetcher& prefetch, KBlock* panel) {
  const __m512i idx = GatherIndex(src.row_bytes);
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch.Block(sb);
    Unpack<F>(src.base + sb * src.block_bytes, src.row_bytes, idx, panel + 8 * sb);
  }
}

template <KFmt F, int NT>
KV_VNNIK_ATTR void PanelTile(const KBlock* panel, int64_t nb, const TileActs& a, float* y,
                             int64_t ld, __mmask16 mask) {
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  RunBlocks<F, NT>(panel, nb, a, 0, acc);
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ld, mask, acc[t]);
}

template <KFmt F>
using DecodeFn = void (*)(const GroupSource&, int64_t, const TileActs&, const GroupPrefetcher&,
                          float*, int64_t, __mmask16);
template <KFmt F>
using TileFn = void (*)(const KBlock*, int64_t, const TileActs&, float*, int64_t, __mmask16);

template <KFmt F, int... I>
constexpr auto MakeDecodeTable(std::integer_sequence<int, I...>) {
  return std::array<DecodeFn<F>, sizeof...(I)>{{&DecodeGroup<F, I + 1>...}};
}
template <KFmt F, int... I>
constexpr auto MakeTileTable(std::integer_sequence<int, I...>) {
  return std::array<TileFn<F>, sizeof...(I)>{{&PanelTile<F, I + 1>...}};
}

template <KFmt F>
void RunRows(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
             int64_t row_end, size_t block_bytes) {
  static constexpr auto kDecode = MakeDecodeTable<F>(std::make_integer_sequence<int, kMaxBatch>());
  static constexpr auto kTile = MakeTileTable<F>(std::make_integer_sequence<int, kActTile>());
  KV_CHECK(w.row_bytes * (kLanes - 1) + 256 < (size_t{1} << 31), "row stride {} too large",
           w.row_bytes);
  const int64_t n_super = w.cols / kSuperBlock;
  const int64_t nb = w.cols / kQBlock;
  const auto* data = static_cast<const uint8_t*>(w.data);
  for (int64_t g0 = row_begin; g0 < row_end; g0 += kLanes) {
    const int64_t nr = std::min<int64_t>(kLanes, row_end - g0);
    GroupSource src{data + static_cast<size_t>(g0) * w.row_bytes, w.row_bytes, block_bytes};
    if (nr < kLanes) {
      // Tail group: copy its rows and zero-fill the rest so every lane reads valid memory.
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
    const __mmask16 mask = RowMask(nr);
    if (acts.n_tokens == 1) {
      DecodeGroupRowOrder<F>(src, n_super, ActsTile(acts, 0), prefetch, y + g0, mask);
      continue;
    }
    if (acts.n_tokens <= kMaxBatch) {
      kDecode[acts.n_tokens - 1](src, n_super, ActsTile(acts, 0), prefetch, y + g0, w.rows, mask);
      continue;
    }
    auto* panel =
        static_cast<KBlock*>(ThreadPanelScratch().Get(static_cast<size_t>(nb) * sizeof(KBlock)));
    PackPanel<F>(src, n_super, prefetch, panel);
    for (int64_t t0 = 0; t0 < acts.n_tokens; t0 += kActTile) {
      const TileActs a = ActsTile(acts, t0);
      kTile[a.nt - 1](panel, nb, a, y + t0 * w.rows + g0, w.rows, mask);
    }
  }
}

}  // namespace

bool HaveKQuantKernels(TensorType type) {
  return type == TensorType::kQ4_K || type == TensorType::kQ5_K || type == TensorType::kQ6_K;
}

void MatMulKQuantRowsVnni(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
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
      KV_CHECK(false, "VNNI K-quant kernel: type {}", static_cast<uint32_t>(w.type));
  }
}

#else  // !KV_HAVE_X86_KERNELS

bool HaveKQuantKernels(TensorType) { return false; }

void MatMulKQuantRowsVnni(const MatrixView&, const QuantActs&, float*, int64_t, int64_t) {
  KV_CHECK(false, "VNNI kernels are not built for this architecture");
}

#endif  // KV_HAVE_X86_KERNELS

}  // namespace kvasir::kernels_internal
