// AVX-512 VNNI kernels for Q8_0/Q4_0 weights x Q8_0 activations.
//
// Sixteen weight rows are processed together, one row per 32-bit lane: a block of 16 rows is
// transposed into eight vectors W[k] whose lane r holds bytes 4k..4k+3 of row r's block (as
// unsigned bytes: Q4_0 nibbles q, Q8_0 values q + 128). vpdpbusd of W[k] with the activation's
// bytes 4k..4k+3 broadcast to every lane then accumulates each row's exact integer dot product in
// its own lane, and QuantActs::corr removes the unsigned offset. One fused multiply-add per block
// applies the scales: the same operations, in the same order, as ref::MatMul and the generic
// kernels.
//
// Decode (one token, or a small batch of up to kMaxDecodeTokens from continuous batching)
// transposes each block in registers as it streams the rows and applies it to every token of the
// batch, so the weights are read once. Prefill transposes a 16-row panel once into a thread-local
// buffer and reuses every loaded block for a tile of up to kActTile tokens, accumulating in
// registers.
#include <array>
#include <cstdint>
#include <utility>

#include "base/check.h"
#include "kernels/matmul_panel.h"
#include "kernels/matmul_x86.h"

#if KV_HAVE_X86_KERNELS
#if !defined(__clang__)
// GCC 12 reports the deliberately undefined pass-through operands inside the AVX-512 intrinsic
// headers as maybe-uninitialized (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

namespace kvasir::kernels_internal {

#if KV_HAVE_X86_KERNELS

#define KV_VNNI_ATTR \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#define KV_VNNI_INLINE KV_VNNI_ATTR inline __attribute__((always_inline))

namespace {

constexpr int kLanes = 16;  // rows per group, one per 32-bit lane of a 512-bit vector

using AliasedI32 = int32_t __attribute__((may_alias));

// One block of a 16-row group after the transpose.
struct alignas(64) PanelBlock {
  uint8_t w[8][64];  // [k][row][4] unsigned bytes
  float d[kLanes];   // weight scales
};
static_assert(sizeof(PanelBlock) == 9 * 64);

KV_VNNI_INLINE __m128i Load128(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

KV_VNNI_INLINE __m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Transposes one block of 16 Q4_0 rows (p: row 0's block, rb: row stride). Lane r of W[k] (k < 4)
// holds the low nibbles of qs[4k..4k+3] of row r (elements 4k..4k+3), W[k + 4] the high nibbles
// (elements 16 + 4k..16 + 4k + 3).
KV_VNNI_INLINE void PackQ4(const uint8_t* p, size_t rb, __m512i gather_idx, __m512i w[8],
                           __m512* d) {
  __m512i z[4];
  for (int j = 0; j < 4; ++j) {
    // 128-bit lane m of z[j] holds row 4m + j.
    __m512i v = _mm512_castsi128_si512(Load128(p + j * rb + 2));
    v = _mm512_inserti32x4(v, Load128(p + (4 + j) * rb + 2), 1);
    v = _mm512_inserti32x4(v, Load128(p + (8 + j) * rb + 2), 2);
    z[j] = _mm512_inserti32x4(v, Load128(p + (12 + j) * rb + 2), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]);
  const __m512i t1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]);
  const __m512i t3 = _mm512_unpackhi_epi32(z[2], z[3]);
  const __m512i q[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                        _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int k = 0; k < 4; ++k) {
    w[k] = _mm512_and_si512(q[k], low4);
    w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(q[k], 4), low4);
  }
  // The dword at each block start is [d, qs0, qs1]; its low half is the f16 scale.
  const __m512i g = _mm512_i32gather_epi32(gather_idx, p, 1);
  *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
}

// Transposes one block of 16 Q8_0 rows: lane r of W[k] holds qs[4k..4k+3] + 128 of row r.
KV_VNNI_INLINE void PackQ8(const uint8_t* p, size_t rb, __m512i gather_idx, __m512i w[8],
                           __m512* d) {
  // 256-bit half m of z[j] holds row 4m + j (j < 4) or 8 + 4m + (j - 4) (j >= 4), which makes the
  // final 128-bit lane shuffle produce rows in order.
  __m512i z[8];
  for (int j = 0; j < 8; ++j) {
    const int r0 = j < 4 ? j : j + 4;
    z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(Load256(p + r0 * rb + 2)),
                              Load256(p + (r0 + 4) * rb + 2), 1);
  }
  __m512i a[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
  }
  // c[k] (k < 4): dword k of each 128-bit lane of rows z[0..3]; c[k + 4]: same for z[4..7].
  __m512i c[8];
  for (int h = 0; h < 2; ++h) {
    c[4 * h + 0] = _mm512_unpacklo_epi64(a[4 * h + 0], a[4 * h + 2]);
    c[4 * h + 1] = _mm512_unpackhi_epi64(a[4 * h + 0], a[4 * h + 2]);
    c[4 * h + 2] = _mm512_unpacklo_epi64(a[4 * h + 1], a[4 * h + 3]);
    c[4 * h + 3] = _mm512_unpackhi_epi64(a[4 * h + 1], a[4 * h + 3]);
  }
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int k = 0; k < 4; ++k) {
    w[k] = _mm512_xor_si512(_mm512_shuffle_i32x4(c[k], c[k + 4], _MM_SHUFFLE(2, 0, 2, 0)), flip);
    w[k + 4] =
        _mm512_xor_si512(_mm512_shuffle_i32x4(c[k], c[k + 4], _MM_SHUFFLE(3, 1, 3, 1)), flip);
  }
  const __m512i g = _mm512_i32gather_epi32(gather_idx, p, 1);
  *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
}

template <bool kQ4>
KV_VNNI_INLINE void Pack(const uint8_t* p, size_t rb, __m512i gather_idx, __m512i w[8], __m512* d) {
  if constexpr (kQ4) {
    PackQ4(p, rb, gather_idx, w, d);
  } else {
    PackQ8(p, rb, gather_idx, w, d);
  }
}

// acc + float(isum) * (dw * dx) for one token's block; xb: the token's 32 int8 values.
KV_VNNI_INLINE __m512 BlockStep(const __m512i w[8], __m512 dw, const int8_t* xb, float dx,
                                int32_t corr, __m512 acc) {
  const auto* xd = reinterpret_cast<const AliasedI32*>(xb);
  // Two independent chains; integer sums are exact, so the split does not change the result.
  __m512i s0 = _mm512_set1_epi32(corr);
  __m512i s1 = _mm512_setzero_si512();
  for (int k = 0; k < 8; k += 2) {
    s0 = _mm512_dpbusd_epi32(s0, w[k], _mm512_set1_epi32(xd[k]));
    s1 = _mm512_dpbusd_epi32(s1, w[k + 1], _mm512_set1_epi32(xd[k + 1]));
  }
  const __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
  return _mm512_fmadd_ps(isum, _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc);
}

__mmask16 RowMask(int64_t n_rows) {
  return static_cast<__mmask16>(n_rows >= kLanes ? 0xFFFF : (1u << n_rows) - 1);
}

constexpr int kMaxBatch = 8;  // w[8] plus one accumulator per token stay in registers

// NT tokens (one activation tile: qs [nb, NT, 32], d and corr [nb, NT]) against a 16-row group
// streamed from the weights; y: row 0 of the group for token 0, token stride `ld`.
template <bool kQ4, int NT>
KV_VNNI_ATTR void DecodeGroup(const GroupSource& src, int64_t nb, const QuantActs& acts,
                              const GroupPrefetcher& prefetch, float* y, int64_t ld,
                              __mmask16 mask) {
  const __m512i idx =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(static_cast<int32_t>(src.row_bytes)));
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  __m512i w[8];
  __m512 dw;
  for (int64_t b = 0; b < nb; ++b) {
    prefetch.Block(b);
    Pack<kQ4>(src.base + b * src.block_bytes, src.row_bytes, idx, w, &dw);
    const int8_t* xb = acts.qs + b * NT * kQBlock;
    const float* db = acts.d + b * NT;
    const int32_t* cb = acts.corr + b * NT;
    if constexpr (NT == 1) {
      acc[0] = BlockStep(w, dw, xb, db[0], cb[0], acc[0]);
    } else {
      // The tokens' chains are independent, so one chain per token keeps the units busy.
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        const auto* xd = reinterpret_cast<const AliasedI32*>(xb + t * kQBlock);
        __m512i s = _mm512_set1_epi32(cb[t]);
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) s = _mm512_dpbusd_epi32(s, w[k], _mm512_set1_epi32(xd[k]));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(db[t])),
                                 acc[t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ld, mask, acc[t]);
}

template <bool kQ4>
using DecodeGroupFn = void (*)(const GroupSource&, int64_t, const QuantActs&,
                               const GroupPrefetcher&, float*, int64_t, __mmask16);

template <bool kQ4, int... I>
constexpr auto MakeDecodeTable(std::integer_sequence<int, I...>) {
  return std::array<DecodeGroupFn<kQ4>, sizeof...(I)>{{&DecodeGroup<kQ4, I + 1>...}};
}

template <bool kQ4>
constexpr auto kDecodeGroups =
    MakeDecodeTable<kQ4>(std::make_integer_sequence<int, kMaxBatch>());

template <bool kQ4>
KV_VNNI_ATTR void PackPanel(const GroupSource& src, int64_t nb, const GroupPrefetcher& prefetch,
                            PanelBlock* panel) {
  const __m512i idx =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(static_cast<int32_t>(src.row_bytes)));
  __m512i w[8];
  __m512 dw;
  for (int64_t b = 0; b < nb; ++b) {
    prefetch.Block(b);
    Pack<kQ4>(src.base + b * src.block_bytes, src.row_bytes, idx, w, &dw);
    for (int k = 0; k < 8; ++k) _mm512_store_si512(panel[b].w[k], w[k]);
    _mm512_store_ps(panel[b].d, dw);
  }
}

// NT tokens of one activation tile against a packed 16-row panel.
// qs: [nb, NT, 32] int8; d, corr: [nb, NT]; y: row 0 of the group for token 0, token stride `ld`.
template <int NT>
KV_VNNI_ATTR void PanelTile(const PanelBlock* panel, int64_t nb, const int8_t* qs, const float* d,
                            const int32_t* corr, float* y, int64_t ld, __mmask16 mask) {
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i w[8];
    for (int k = 0; k < 8; ++k) w[k] = _mm512_load_si512(panel[b].w[k]);
    const __m512 dw = _mm512_load_ps(panel[b].d);
    const int8_t* xb = qs + b * NT * kQBlock;
    const float* db = d + b * NT;
    const int32_t* cb = corr + b * NT;
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
      const auto* xd = reinterpret_cast<const AliasedI32*>(xb + t * kQBlock);
      __m512i s = _mm512_set1_epi32(cb[t]);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) s = _mm512_dpbusd_epi32(s, w[k], _mm512_set1_epi32(xd[k]));
      acc[t] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(db[t])), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ld, mask, acc[t]);
}

using PanelTileFn = void (*)(const PanelBlock*, int64_t, const int8_t*, const float*,
                             const int32_t*, float*, int64_t, __mmask16);

template <int... I>
constexpr auto MakeTileTable(std::integer_sequence<int, I...>) {
  return std::array<PanelTileFn, sizeof...(I)>{{&PanelTile<I + 1>...}};
}

constexpr auto kPanelTiles = MakeTileTable(std::make_integer_sequence<int, kActTile>());

struct VnniKernel {
  static constexpr int kGroup = kLanes;
  static constexpr int kMaxDecodeTokens = kMaxBatch;
  using Panel = PanelBlock;
  template <bool kQ4>
  static void Decode(const GroupSource& src, int64_t nb, const QuantActs& acts,
                     const GroupPrefetcher& prefetch, float* y, int64_t ld, int64_t nr) {
    kDecodeGroups<kQ4>[acts.n_tokens - 1](src, nb, acts, prefetch, y, ld, RowMask(nr));
  }
  template <bool kQ4>
  static void Pack(const GroupSource& src, int64_t nb, const GroupPrefetcher& prefetch,
                   Panel* panel) {
    PackPanel<kQ4>(src, nb, prefetch, panel);
  }
  template <bool kQ4>
  static void Tile(const Panel* panel, int64_t nb, const int8_t* qs, const float* d,
                   const int32_t* corr, int64_t nt, float* y, int64_t ld, int64_t nr) {
    kPanelTiles[nt - 1](panel, nb, qs, d, corr, y, ld, RowMask(nr));
  }
};

}  // namespace

void MatMulQuantRowsVnni(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                         int64_t row_end) {
  if (w.type == TensorType::kQ4_0) {
    RunPanelRows<VnniKernel, true>(w, acts, y, row_begin, row_end);
  } else {
    KV_CHECK(w.type == TensorType::kQ8_0, "VNNI kernel: type {}", static_cast<uint32_t>(w.type));
    RunPanelRows<VnniKernel, false>(w, acts, y, row_begin, row_end);
  }
}

#else  // !KV_HAVE_X86_KERNELS

void MatMulQuantRowsVnni(const MatrixView&, const QuantActs&, float*, int64_t, int64_t) {
  KV_CHECK(false, "VNNI kernels are not built for this architecture");
}

#endif  // KV_HAVE_X86_KERNELS

}  // namespace kvasir::kernels_internal
