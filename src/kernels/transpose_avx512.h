// A 16 x 16 transpose of 32-bit words in AVX-512 registers: how the attention kernels pack keys
// (attention_tiles, attention_bf16) without gathers. Only for callers compiled with AVX-512F
// enabled (a target pragma or attribute), on x86-64.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace kvasir::kernels_internal {

// out[c * 16 + j] = in[j * in_stride + c] for j, c < 16; in_stride in 32-bit words. 64 shuffles
// per 256 words, against 16 gathers of 16 loads each.
__attribute__((target("avx512f"), always_inline)) inline void Transpose16x16(const void* in,
                                                                             int64_t in_stride,
                                                                             void* out) {
  const float* src = static_cast<const float*>(in);
  float* dst = static_cast<float*>(out);
  __m512 r[16], t[16];
  for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(src + j * in_stride);
  // t[2i], t[2i + 1]: rows 2i and 2i + 1 interleaved within each 128-bit lane.
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + c]: rows 4i .. 4i + 3 of column 4l + c in 128-bit lane l.
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // t[8h + c] (c < 4): columns c and c + 8 of rows 8h .. 8h + 7; t[8h + 4 + c]: columns c + 4
  // and c + 12 of the same rows.
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 4; ++c) {
      const __m512 a = r[8 * h + c], b = r[8 * h + 4 + c];
      t[8 * h + c] = _mm512_shuffle_f32x4(a, b, 0x88);
      t[8 * h + 4 + c] = _mm512_shuffle_f32x4(a, b, 0xdd);
    }
  }
  for (int c = 0; c < 8; ++c) {
    _mm512_storeu_ps(dst + c * 16, _mm512_shuffle_f32x4(t[c], t[c + 8], 0x88));
    _mm512_storeu_ps(dst + (c + 8) * 16, _mm512_shuffle_f32x4(t[c], t[c + 8], 0xdd));
  }
}

}  // namespace kvasir::kernels_internal
