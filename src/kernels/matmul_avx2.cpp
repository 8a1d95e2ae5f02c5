// AVX2 kernels for Q8_0/Q4_0 weights x Q8_0 activations, for CPUs without AVX512-VNNI.
//
// Same scheme as the VNNI kernels with eight rows per group (one per 32-bit lane of a 256-bit
// vector): lane r of W[k] holds bytes 4k..4k+3 of row r's block, and the activation's bytes
// 4k..4k+3 are broadcast. vpmaddubsw (unsigned x signed bytes, pairs summed to int16) and
// vpmaddwd with ones then give each row's exact integer dot product in its lane:
// - Q4_0: the unsigned nibbles q go in directly; pair sums are at most 2 * 15 * 127, so all eight
//   products of a block add up in int16 without saturating, and QuantActs::corr removes the 8.
// - Q8_0: |w| and sign(x, w) keep the pair sums within int16 (|x| <= 127: the quantizer never
//   makes -128); each product is widened to int32 before adding. corr is not used.
// One fused multiply-add per block applies the scales, exactly as ref::MatMul does.
#include <cstdint>

#include "base/check.h"
#include "kernels/matmul_panel.h"
#include "kernels/matmul_x86.h"

#if KV_HAVE_X86_KERNELS
#include <immintrin.h>
#endif

namespace kvasir::kernels_internal {

#if KV_HAVE_X86_KERNELS

#define KV_AVX2_ATTR __attribute__((target("avx2,fma,f16c")))
#define KV_AVX2_INLINE KV_AVX2_ATTR inline __attribute__((always_inline))

namespace {

constexpr int kLanes = 8;       // rows per group
constexpr int kTileTokens = 4;  // tokens per register tile (16 vector registers)

using AliasedI32 = int32_t __attribute__((may_alias));

// One block of an 8-row group after the transpose. Q4_0 uses w[0..8) (nibbles); Q8_0 uses
// w[0..8) for |q| and w[8..16) for q.
struct alignas(32) PanelBlock2 {
  uint8_t w[16][32];  // [k][row][4]
  float d[kLanes];
};

KV_AVX2_INLINE __m128i Load128(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

KV_AVX2_INLINE __m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// The f16 scales of 8 rows: the dword at each block start is [d, qs0, qs1].
KV_AVX2_INLINE __m256 GatherScales(const uint8_t* p, __m256i gather_idx) {
  const __m256i g =
      _mm256_and_si256(_mm256_i32gather_epi32(reinterpret_cast<const int*>(p), gather_idx, 1),
                       _mm256_set1_epi32(0xFFFF));
  const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
  return _mm256_cvtph_ps(h);
}

// Lane r of w[k] (k < 4): low nibbles of qs[4k..4k+3] of row r; w[k + 4]: the high nibbles.
KV_AVX2_INLINE void PackQ4(const uint8_t* p, size_t rb, __m256i gather_idx, __m256i w[8],
                           __m256* d) {
  __m256i z[4];
  for (int j = 0; j < 4; ++j) {
    // 128-bit lane m of z[j] holds row 4m + j.
    z[j] = _mm256_inserti128_si256(_mm256_castsi128_si256(Load128(p + j * rb + 2)),
                                   Load128(p + (4 + j) * rb + 2), 1);
  }
  const __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]);
  const __m256i t1 = _mm256_unpackhi_epi32(z[0], z[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(z[2], z[3]);
  const __m256i t3 = _mm256_unpackhi_epi32(z[2], z[3]);
  const __m256i q[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                        _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int k = 0; k < 4; ++k) {
    w[k] = _mm256_and_si256(q[k], low4);
    w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(q[k], 4), low4);
  }
  *d = GatherScales(p, gather_idx);
}

// Lane r of w[k]: qs[4k..4k+3] of row r (signed); wabs[k]: their absolute values.
KV_AVX2_INLINE void PackQ8(const uint8_t* p, size_t rb, __m256i gather_idx, __m256i w[8],
                           __m256i wabs[8], __m256* d) {
  __m256i z[8];
  for (int r = 0; r < 8; ++r) z[r] = Load256(p + r * rb + 2);
  __m256i a[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm256_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
    a[2 * i + 1] = _mm256_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
  }
  // c[k] (k < 4): dword k of each 128-bit lane of rows 0..3; c[k + 4]: same for rows 4..7.
  __m256i c[8];
  for (int h = 0; h < 2; ++h) {
    c[4 * h + 0] = _mm256_unpacklo_epi64(a[4 * h + 0], a[4 * h + 2]);
    c[4 * h + 1] = _mm256_unpackhi_epi64(a[4 * h + 0], a[4 * h + 2]);
    c[4 * h + 2] = _mm256_unpacklo_epi64(a[4 * h + 1], a[4 * h + 3]);
    c[4 * h + 3] = _mm256_unpackhi_epi64(a[4 * h + 1], a[4 * h + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    w[k] = _mm256_permute2x128_si256(c[k], c[k + 4], 0x20);
    w[k + 4] = _mm256_permute2x128_si256(c[k], c[k + 4], 0x31);
  }
  for (int k = 0; k < 8; ++k) wabs[k] = _mm256_abs_epi8(w[k]);
  *d = GatherScales(p, gather_idx);
}

// Exact integer dot products of 8 rows with one token's block (xb: 32 int8 values).
KV_AVX2_INLINE __m256i DotQ4(const __m256i* w, const int8_t* xb, int32_t corr) {
  const auto* xd = reinterpret_cast<const AliasedI32*>(xb);
  __m256i p = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(xd[0]));
  for (int k = 1; k < 8; ++k) {
    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[k], _mm256_set1_epi32(xd[k])));
  }
  return _mm256_add_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)), _mm256_set1_epi32(corr));
}

KV_AVX2_INLINE __m256i DotQ8(const __m256i* w, const __m256i* wabs, const int8_t* xb) {
  const auto* xd = reinterpret_cast<const AliasedI32*>(xb);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s = _mm256_setzero_si256();
  for (int k = 0; k < 8; ++k) {
    const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(xd[k]), w[k]);
    s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[k], xs), ones));
  }
  return s;
}

KV_AVX2_INLINE __m256 ScaleAccumulate(__m256i isum, __m256 dw, float dx, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc);
}

KV_AVX2_INLINE __m256i GatherIndex(size_t row_bytes) {
  return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                            _mm256_set1_epi32(static_cast<int32_t>(row_bytes)));
}

KV_AVX2_INLINE void StoreRows(float* y, __m256 v, int64_t nr) {
  if (nr >= kLanes) {
    _mm256_storeu_ps(y, v);
    return;
  }
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(nr)), lane), v);
}

template <bool kQ4>
KV_AVX2_ATTR void DecodeGroup(const GroupSource& src, int64_t nb, const QuantActs& acts,
                              const GroupPrefetcher& prefetch, float* y, int64_t nr) {
  const __m256i idx = GatherIndex(src.row_bytes);
  __m256 acc = _mm256_setzero_ps();
  __m256i w[8];
  __m256i wabs[8];
  __m256 dw;
  for (int64_t b = 0; b < nb; ++b) {
    prefetch.Block(b);
    const uint8_t* p = src.base + b * src.block_bytes;
    const int8_t* xb = acts.qs + b * kQBlock;
    __m256i isum;
    if constexpr (kQ4) {
      PackQ4(p, src.row_bytes, idx, w, &dw);
      isum = DotQ4(w, xb, acts.corr[b]);
    } else {
      PackQ8(p, src.row_bytes, idx, w, wabs, &dw);
      isum = DotQ8(w, wabs, xb);
    }
    acc = ScaleAccumulate(isum, dw, acts.d[b], acc);
  }
  StoreRows(y, acc, nr);
}

template <bool kQ4>
KV_AVX2_ATTR void PackPanel(const GroupSource& src, int64_t nb, const GroupPrefetcher& prefetch,
                            PanelBlock2* panel) {
  const __m256i idx = GatherIndex(src.row_bytes);
  __m256i w[8];
  __m256i wabs[8];
  __m256 dw;
  for (int64_t b = 0; b < nb; ++b) {
    prefetch.Block(b);
    const uint8_t* p = src.base + b * src.block_bytes;
    auto* out = reinterpret_cast<__m256i*>(panel[b].w);
    if constexpr (kQ4) {
      PackQ4(p, src.row_bytes, idx, w, &dw);
      for (int k = 0; k < 8; ++k) _mm256_store_si256(out + k, w[k]);
    } else {
      PackQ8(p, src.row_bytes, idx, w, wabs, &dw);
      for (int k = 0; k < 8; ++k) _mm256_store_si256(out + k, wabs[k]);
      for (int k = 0; k < 8; ++k) _mm256_store_si256(out + 8 + k, w[k]);
    }
    _mm256_store_ps(panel[b].d, dw);
  }
}

// T tokens (at most kTileTokens) of a QuantActs tile whose blocks hold `stride` tokens.
template <bool kQ4, int T>
KV_AVX2_ATTR void PanelTile(const PanelBlock2* panel, int64_t nb, const int8_t* qs, const float* d,
                            const int32_t* corr, int64_t stride, float* y, int64_t ld, int64_t nr) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const auto* w = reinterpret_cast<const __m256i*>(panel[b].w);
    const __m256 dw = _mm256_load_ps(panel[b].d);
    for (int t = 0; t < T; ++t) {
      const int64_t slot = b * stride + t;
      const __m256i isum =
          kQ4 ? DotQ4(w, qs + slot * kQBlock, corr[slot]) : DotQ8(w + 8, w, qs + slot * kQBlock);
      acc[t] = ScaleAccumulate(isum, dw, d[slot], acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) StoreRows(y + t * ld, acc[t], nr);
}

struct Avx2Kernel {
  static constexpr int kGroup = kLanes;
  static constexpr int kMaxDecodeTokens = 1;
  using Panel = PanelBlock2;
  template <bool kQ4>
  static void Decode(const GroupSource& src, int64_t nb, const QuantActs& acts,
                     const GroupPrefetcher& prefetch, float* y, int64_t /*ld*/, int64_t nr) {
    DecodeGroup<kQ4>(src, nb, acts, prefetch, y, nr);
  }
  template <bool kQ4>
  static void Pack(const GroupSource& src, int64_t nb, const GroupPrefetcher& prefetch,
                   Panel* panel) {
    PackPanel<kQ4>(src, nb, prefetch, panel);
  }
  template <bool kQ4>
  static void Tile(const Panel* panel, int64_t nb, const int8_t* qs, const float* d,
                   const int32_t* corr, int64_t nt, float* y, int64_t ld, int64_t nr) {
    for (int64_t t0 = 0; t0 < nt; t0 += kTileTokens) {
      const int64_t n = std::min<int64_t>(kTileTokens, nt - t0);
      const int8_t* q = qs + t0 * kQBlock;
      float* yt = y + t0 * ld;
      switch (n) {
        case 4:
          PanelTile<kQ4, 4>(panel, nb, q, d + t0, corr + t0, nt, yt, ld, nr);
          break;
        case 3:
          PanelTile<kQ4, 3>(panel, nb, q, d + t0, corr + t0, nt, yt, ld, nr);
          break;
        case 2:
          PanelTile<kQ4, 2>(panel, nb, q, d + t0, corr + t0, nt, yt, ld, nr);
          break;
        default:
          PanelTile<kQ4, 1>(panel, nb, q, d + t0, corr + t0, nt, yt, ld, nr);
          break;
      }
    }
  }
};

}  // namespace

bool HaveX86Kernels() { return true; }

void MatMulQuantRowsAvx2(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                         int64_t row_end) {
  if (w.type == TensorType::kQ4_0) {
    RunPanelRows<Avx2Kernel, true>(w, acts, y, row_begin, row_end);
  } else {
    KV_CHECK(w.type == TensorType::kQ8_0, "AVX2 kernel: type {}", static_cast<uint32_t>(w.type));
    RunPanelRows<Avx2Kernel, false>(w, acts, y, row_begin, row_end);
  }
}

#else  // !KV_HAVE_X86_KERNELS

bool HaveX86Kernels() { return false; }

void MatMulQuantRowsAvx2(const MatrixView&, const QuantActs&, float*, int64_t, int64_t) {
  KV_CHECK(false, "x86 kernels are not built for this architecture");
}

#endif  // KV_HAVE_X86_KERNELS

}  // namespace kvasir::kernels_internal
