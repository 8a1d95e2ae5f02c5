// Reference (de)quantizers of Q4_1, Q5_0, Q5_1 and the K-quants. The quantizers follow ggml's
// reference algorithms (quantize_row_*_ref): for the K-quants, a per-sub-block search of the scale
// (and min) minimising a weighted error, then 6-, 4- or 8-bit quantization of those scales against
// an f16 super-block scale, then the values rounded again against the stored scales.
#include "kernels/quant_ref.h"

#include "kernels/quant_ints.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "base/check.h"

namespace kvasir::ref {
namespace {

constexpr int kQK = kSuperBlock;
constexpr float kTinyGroup = 1e-15f;  // a group whose largest magnitude is below this is zero

// Round to nearest, ties to even (as ggml's nearest_int, for the magnitudes that occur here).
int NearestInt(float v) { return static_cast<int>(std::nearbyint(v)); }

// ---- Blocks of 32 -----------------------------------------------------------------------------

// Q4_1 / Q5_1: d = (max - min) / (2^bits - 1), m = min, q = trunc((x - min) / d + 0.5).
template <int kBits>
void QuantizeMinMax(const float* x, uint16_t* d_out, uint16_t* m_out, uint8_t q[32]) {
  float lo = FLT_MAX;
  float hi = -FLT_MAX;
  for (int j = 0; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  const float d = (hi - lo) / static_cast<float>((1 << kBits) - 1);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  *d_out = F32ToF16(d);
  *m_out = F32ToF16(lo);
  for (int j = 0; j < 32; ++j) {
    const int v = static_cast<int8_t>((x[j] - lo) * id + 0.5f);
    q[j] = static_cast<uint8_t>(std::min(v, (1 << kBits) - 1));
  }
}

void PackNibbles(const uint8_t q[32], uint8_t qs[16]) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 15) | (q[j + 16] & 15) << 4);
}

void PackHighBits(const uint8_t q[32], uint8_t qh[4]) {
  uint32_t bits = 0;
  for (int j = 0; j < 32; ++j) bits |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  for (int k = 0; k < 4; ++k) qh[k] = static_cast<uint8_t>(bits >> (8 * k));
}

void QuantizeQ5_0Block(const float* x, BlockQ5_0* out) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  out->d = F32ToF16(d);
  uint8_t q[32];
  for (int j = 0; j < 32; ++j) {
    q[j] = static_cast<uint8_t>(std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f))));
  }
  PackNibbles(q, out->qs);
  PackHighBits(q, out->qh);
}

uint32_t HighBits(const uint8_t qh[4]) {
  return uint32_t{qh[0]} | uint32_t{qh[1]} << 8 | uint32_t{qh[2]} << 16 | uint32_t{qh[3]} << 24;
}

// ---- Scale searches of the K-quants ------------------------------------------------------------

// Fits x ~ scale * L + min with L in [0, nmax] and min <= 0, minimising sum w (error)^2 (or |error|
// with abs_err): first from the range, then for nstep + 1 trial grids (nmax + rmin + rdelta * k
// steps from the current min to the max), each followed by the weighted least-squares scale and
// min of its levels. Returns the scale; *neg_min receives -min.
float FitScaleAndMin(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min,
                     float rmin, float rdelta, int nstep, bool abs_err) {
  float lo = x[0];
  float hi = x[0];
  float sum_w = w[0];
  float sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  lo = std::min(lo, 0.0f);
  if (hi == lo) {
    std::fill(L, L + n, 0);
    *neg_min = -lo;
    return 0.0f;
  }
  auto error_of = [&](float scale, float min, const uint8_t* levels) {
    float err = 0.0f;
    for (int i = 0; i < n; ++i) {
      float diff = scale * static_cast<float>(levels[i]) + min - x[i];
      diff = abs_err ? std::fabs(diff) : diff * diff;
      err += w[i] * diff;
    }
    return err;
  };
  float inv = static_cast<float>(nmax) / (hi - lo);
  float scale = 1.0f / inv;
  for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(std::clamp(NearestInt(inv * (x[i] - lo)), 0, nmax));
  float best = error_of(scale, lo, L);
  float min = lo;
  uint8_t trial[32];
  // Each trial grid starts from the best min found so far (as ggml's search does).
  for (int step = 0; step <= nstep && nstep >= 1; ++step) {
    inv = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (hi - min);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(inv * (x[i] - min)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      const float fl = static_cast<float>(l);
      sum_l += w[i] * fl;
      sum_l2 += w[i] * fl * fl;
      sum_xl += w[i] * fl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0.0f) continue;
    float t_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float t_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (t_min > 0.0f) {
      t_min = 0.0f;
      t_scale = sum_xl / sum_l2;
    }
    const float err = error_of(t_scale, t_min, trial);
    if (err < best) {
      std::memcpy(L, trial, static_cast<size_t>(n));
      best = err;
      scale = t_scale;
      min = t_min;
    }
  }
  *neg_min = -min;
  return scale;
}

// Symmetric fit x ~ scale * l, l in [-nmax, nmax - 1], weights x^2: the grid of the signed value
// of largest magnitude (mapped to -nmax), then 18 neighbouring grids, keeping the one whose
// least-squares scale explains most of sum w x^2. L receives l + nmax. Returns the scale.
float FitSymmetricScale(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kTinyGroup) {
    std::fill(L, L + n, 0);
    return 0.0f;
  }
  auto level = [&](float inv, int i) { return std::clamp(NearestInt(inv * x[i]), -nmax, nmax - 1); };
  auto sums = [&](float inv, float* sum_xl, float* sum_l2) {
    *sum_xl = *sum_l2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float l = static_cast<float>(level(inv, i));
      const float w = x[i] * x[i];
      *sum_xl += w * x[i] * l;
      *sum_l2 += w * l * l;
    }
  };
  float inv = -static_cast<float>(nmax) / max;
  float sum_xl, sum_l2;
  sums(inv, &sum_xl, &sum_l2);
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(level(inv, i) + nmax);
  float scale = sum_l2 != 0.0f ? sum_xl / sum_l2 : 0.0f;
  float best = scale * sum_xl;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    inv = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(k)) / max;
    sums(inv, &sum_xl, &sum_l2);
    if (sum_l2 > 0.0f && sum_xl * sum_xl > best * sum_l2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(level(inv, i) + nmax);
      scale = sum_xl / sum_l2;
      best = scale * sum_xl;
    }
  }
  return scale;
}

// Q3_K's fit: the grid of the largest magnitude, then up to five passes that move single levels
// to where the current least-squares scale puts them when that improves the fit (weights x^2).
// L receives l + nmax, l in [-nmax, nmax - 1]. Returns the scale.
float FitQ3Scale(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kTinyGroup) {
    std::fill(L, L + n, 0);
    return 0.0f;
  }
  const float inv = -static_cast<float>(nmax) / max;
  float sum_xl = 0.0f, sum_l2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(NearestInt(inv * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sum_xl += w * x[i] * static_cast<float>(l);
    sum_l2 += w * static_cast<float>(l * l);
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float xl = sum_xl - w * x[i] * static_cast<float>(L[i]);
      if (xl <= 0.0f) continue;
      float l2 = sum_l2 - w * static_cast<float>(L[i] * L[i]);
      const int nl = std::clamp(NearestInt(x[i] * l2 / xl), -nmax, nmax - 1);
      if (nl == L[i]) continue;
      xl += w * x[i] * static_cast<float>(nl);
      l2 += w * static_cast<float>(nl * nl);
      if (l2 > 0.0f && xl * xl * sum_l2 > sum_xl * sum_xl * l2) {
        L[i] = static_cast<int8_t>(nl);
        sum_xl = xl;
        sum_l2 = l2;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return sum_l2 > 0.0f ? sum_xl / sum_l2 : 0.0f;
}

// Packs 2-bit fields of 256 levels (Q2_K/Q3_K layout).
void PackQ2Fields(const uint8_t* L, uint8_t qs[64]) {
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* v = L + 128 * h + l;
      qs[32 * h + l] = static_cast<uint8_t>(v[0] | v[32] << 2 | v[64] << 4 | v[96] << 6);
    }
  }
}

// ---- K-quant block quantizers ------------------------------------------------------------------

// Q4_K (kBits 4) and Q5_K (kBits 5): 8 sub-blocks of 32 with 6-bit scales and mins.
template <int kBits>
void QuantizeQ45K(const float* x, uint16_t* d_out, uint16_t* dmin_out, uint8_t scales[12],
                  uint8_t L[kQK]) {
  constexpr int kMax = (1 << kBits) - 1;
  float sc[8], mn[8], w[32];
  float max_sc = 0.0f, max_mn = 0.0f;
  for (int j = 0; j < 8; ++j) {
    const float* xj = x + 32 * j;
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += xj[l] * xj[l];
    const float rms = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < 32; ++l) w[l] = rms + std::fabs(xj[l]);
    sc[j] = kBits == 4 ? FitScaleAndMin(32, kMax, xj, w, L + 32 * j, &mn[j], -1.0f, 0.1f, 20, false)
                       : FitScaleAndMin(32, kMax, xj, w, L + 32 * j, &mn[j], -0.5f, 0.1f, 15, false);
    max_sc = std::max(max_sc, sc[j]);
    max_mn = std::max(max_mn, mn[j]);
  }
  const float inv_sc = max_sc > 0.0f ? 63.0f / max_sc : 0.0f;
  const float inv_mn = max_mn > 0.0f ? 63.0f / max_mn : 0.0f;
  std::memset(scales, 0, 12);
  for (int j = 0; j < 8; ++j) {
    const int ls = std::min(63, static_cast<int>(static_cast<uint8_t>(NearestInt(inv_sc * sc[j]))));
    const int lm = std::min(63, static_cast<int>(static_cast<uint8_t>(NearestInt(inv_mn * mn[j]))));
    if (j < 4) {
      scales[j] |= static_cast<uint8_t>(ls);
      scales[j + 4] |= static_cast<uint8_t>(lm);
    } else {
      scales[j + 4] = static_cast<uint8_t>((ls & 15) | (lm & 15) << 4);
      scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  *d_out = F32ToF16(max_sc / 63.0f);
  *dmin_out = F32ToF16(max_mn / 63.0f);
  for (int j = 0; j < 8; ++j) {
    int ls, lm;
    Q4KScaleMin(scales, j, &ls, &lm);
    const float d = F16ToF32(*d_out) * static_cast<float>(ls);
    if (d == 0.0f) continue;
    const float dm = F16ToF32(*dmin_out) * static_cast<float>(lm);
    for (int l = 0; l < 32; ++l) {
      L[32 * j + l] = static_cast<uint8_t>(std::clamp(NearestInt((x[32 * j + l] + dm) / d), 0, kMax));
    }
  }
}

void QuantizeQ4KBlock(const float* x, BlockQ4_K* out) {
  uint8_t L[kQK];
  QuantizeQ45K<4>(x, &out->d, &out->dmin, out->scales, L);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      out->qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | L[64 * c + 32 + l] << 4);
    }
  }
}

void QuantizeQ5KBlock(const float* x, BlockQ5_K* out) {
  uint8_t L[kQK];
  QuantizeQ45K<5>(x, &out->d, &out->dmin, out->scales, L);
  std::memset(out->qh, 0, sizeof(out->qh));
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int a = L[64 * c + l];
      const int b = L[64 * c + 32 + l];
      out->qs[32 * c + l] = static_cast<uint8_t>((a & 15) | (b & 15) << 4);
      out->qh[l] |= static_cast<uint8_t>((a >> 4) << (2 * c) | (b >> 4) << (2 * c + 1));
    }
  }
}

void QuantizeQ6KBlock(const float* x, BlockQ6_K* out) {
  int8_t L[kQK];
  float sc[16];
  float max_abs = 0.0f, max_sc = 0.0f;
  for (int j = 0; j < 16; ++j) {
    sc[j] = FitSymmetricScale(16, 32, x + 16 * j, L + 16 * j);
    if (std::fabs(sc[j]) > max_abs) {
      max_abs = std::fabs(sc[j]);
      max_sc = sc[j];
    }
  }
  if (max_abs < kTinyGroup) {
    std::memset(out, 0, sizeof(*out));
    return;
  }
  const float inv = -128.0f / max_sc;
  out->d = F32ToF16(1.0f / inv);
  for (int j = 0; j < 16; ++j) out->scales[j] = static_cast<int8_t>(std::min(127, NearestInt(inv * sc[j])));
  for (int j = 0; j < 16; ++j) {
    const float d = F16ToF32(out->d) * static_cast<float>(out->scales[j]);
    if (d == 0.0f) continue;
    for (int l = 0; l < 16; ++l) {
      L[16 * j + l] = static_cast<int8_t>(std::clamp(NearestInt(x[16 * j + l] / d), -32, 31) + 32);
    }
  }
  for (int n = 0; n < 2; ++n) {
    for (int l = 0; l < 32; ++l) {
      const int8_t* v = L + 128 * n + l;
      out->ql[64 * n + l] = static_cast<uint8_t>((v[0] & 15) | (v[64] & 15) << 4);
      out->ql[64 * n + 32 + l] = static_cast<uint8_t>((v[32] & 15) | (v[96] & 15) << 4);
      out->qh[32 * n + l] =
          static_cast<uint8_t>(v[0] >> 4 | (v[32] >> 4) << 2 | (v[64] >> 4) << 4 | (v[96] >> 4) << 6);
    }
  }
}

void QuantizeQ3KBlock(const float* x, BlockQ3_K* out) {
  int8_t L[kQK];
  float sc[16];
  float max_abs = 0.0f, max_sc = 0.0f;
  for (int j = 0; j < 16; ++j) {
    sc[j] = FitQ3Scale(16, 4, x + 16 * j, L + 16 * j);
    if (std::fabs(sc[j]) > max_abs) {
      max_abs = std::fabs(sc[j]);
      max_sc = sc[j];
    }
  }
  std::memset(out->scales, 0, sizeof(out->scales));
  if (max_sc != 0.0f) {
    const float inv = -32.0f / max_sc;
    for (int j = 0; j < 16; ++j) {
      const int l = std::clamp(NearestInt(inv * sc[j]), -32, 31) + 32;
      if (j < 8) {
        out->scales[j] = static_cast<uint8_t>(l & 15);
      } else {
        out->scales[j - 8] |= static_cast<uint8_t>((l & 15) << 4);
      }
      out->scales[8 + j % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
    }
    out->d = F32ToF16(1.0f / inv);
  } else {
    out->d = F32ToF16(0.0f);
  }
  for (int j = 0; j < 16; ++j) {
    const float d = F16ToF32(out->d) * static_cast<float>(Q3KScale(out->scales, j) - 32);
    if (d == 0.0f) continue;
    for (int l = 0; l < 16; ++l) {
      L[16 * j + l] = static_cast<int8_t>(std::clamp(NearestInt(x[16 * j + l] / d), -4, 3) + 4);
    }
  }
  std::memset(out->hmask, 0, sizeof(out->hmask));
  uint8_t low[kQK];
  for (int v = 0; v < kQK; ++v) {
    if (L[v] > 3) out->hmask[v % 32] |= static_cast<uint8_t>(1 << (v / 32));
    low[v] = static_cast<uint8_t>(L[v] & 3);
  }
  PackQ2Fields(low, out->qs);
}

void QuantizeQ2KBlock(const float* x, BlockQ2_K* out) {
  uint8_t L[kQK];
  float sc[16], mn[16], w[16];
  float max_sc = 0.0f, max_mn = 0.0f;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) w[l] = std::fabs(x[16 * j + l]);
    sc[j] = FitScaleAndMin(16, 3, x + 16 * j, w, L + 16 * j, &mn[j], -0.5f, 0.1f, 15, true);
    max_sc = std::max(max_sc, sc[j]);
    max_mn = std::max(max_mn, mn[j]);
  }
  for (int j = 0; j < 16; ++j) out->scales[j] = 0;
  out->d = F32ToF16(0.0f);
  out->dmin = F32ToF16(0.0f);
  if (max_sc > 0.0f) {
    const float inv = 15.0f / max_sc;
    for (int j = 0; j < 16; ++j) out->scales[j] = static_cast<uint8_t>(NearestInt(inv * sc[j]));
    out->d = F32ToF16(max_sc / 15.0f);
  }
  if (max_mn > 0.0f) {
    const float inv = 15.0f / max_mn;
    for (int j = 0; j < 16; ++j) out->scales[j] |= static_cast<uint8_t>(NearestInt(inv * mn[j]) << 4);
    out->dmin = F32ToF16(max_mn / 15.0f);
  }
  for (int j = 0; j < 16; ++j) {
    const float d = F16ToF32(out->d) * static_cast<float>(out->scales[j] & 15);
    if (d == 0.0f) continue;
    const float dm = F16ToF32(out->dmin) * static_cast<float>(out->scales[j] >> 4);
    for (int l = 0; l < 16; ++l) {
      L[16 * j + l] = static_cast<uint8_t>(std::clamp(NearestInt((x[16 * j + l] + dm) / d), 0, 3));
    }
  }
  PackQ2Fields(L, out->qs);
}

template <class Block, class Fn>
void ForBlocks(const float* src, int64_t n, int64_t values, void* dst, Fn fn) {
  KV_CHECK(n % values == 0, "row of {} values is not a multiple of {}", n, values);
  auto* out = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / values; ++b) fn(src + b * values, &out[b]);
}

template <class Block>
Block LoadBlock(const void* src, int64_t b) {
  Block blk;
  std::memcpy(&blk, static_cast<const uint8_t*>(src) + b * sizeof(Block), sizeof(Block));
  return blk;
}

int Q2Field(const uint8_t* qs, int v) { return (qs[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3; }

}  // namespace

bool IsExtraQuantType(TensorType type) {
  return kernels_internal::IsQuantizedType(type) && type != TensorType::kQ8_0 && type != TensorType::kQ4_0;
}

void QuantizeExtraRow(TensorType type, const float* src, int64_t n, void* dst) {
  switch (type) {
    case TensorType::kQ4_1:
      ForBlocks<BlockQ4_1>(src, n, 32, dst, [](const float* x, BlockQ4_1* b) {
        uint8_t q[32];
        QuantizeMinMax<4>(x, &b->d, &b->m, q);
        PackNibbles(q, b->qs);
      });
      return;
    case TensorType::kQ5_0:
      ForBlocks<BlockQ5_0>(src, n, 32, dst, QuantizeQ5_0Block);
      return;
    case TensorType::kQ5_1:
      ForBlocks<BlockQ5_1>(src, n, 32, dst, [](const float* x, BlockQ5_1* b) {
        uint8_t q[32];
        QuantizeMinMax<5>(x, &b->d, &b->m, q);
        PackNibbles(q, b->qs);
        PackHighBits(q, b->qh);
      });
      return;
    case TensorType::kQ2_K:
      ForBlocks<BlockQ2_K>(src, n, kQK, dst, QuantizeQ2KBlock);
      return;
    case TensorType::kQ3_K:
      ForBlocks<BlockQ3_K>(src, n, kQK, dst, QuantizeQ3KBlock);
      return;
    case TensorType::kQ4_K:
      ForBlocks<BlockQ4_K>(src, n, kQK, dst, QuantizeQ4KBlock);
      return;
    case TensorType::kQ5_K:
      ForBlocks<BlockQ5_K>(src, n, kQK, dst, QuantizeQ5KBlock);
      return;
    case TensorType::kQ6_K:
      ForBlocks<BlockQ6_K>(src, n, kQK, dst, QuantizeQ6KBlock);
      return;
    default:
      KV_CHECK(false, "QuantizeExtraRow: type {}", static_cast<uint32_t>(type));
  }
}

void DequantizeExtraRow(TensorType type, const void* src, int64_t n, float* dst) {
  const int64_t values = BlockValues(type);
  KV_CHECK(n % values == 0, "row of {} values is not a multiple of {}", n, values);
  for (int64_t b = 0; b < n / values; ++b) {
    float* y = dst + b * values;
    switch (type) {
      case TensorType::kQ4_1: {
        const auto blk = LoadBlock<BlockQ4_1>(src, b);
        const float d = F16ToF32(blk.d), m = F16ToF32(blk.m);
        for (int j = 0; j < 16; ++j) {
          y[j] = static_cast<float>(blk.qs[j] & 15) * d + m;
          y[j + 16] = static_cast<float>(blk.qs[j] >> 4) * d + m;
        }
        break;
      }
      case TensorType::kQ5_0:
      case TensorType::kQ5_1: {
        const bool q51 = type == TensorType::kQ5_1;
        uint16_t d16, m16 = 0;
        uint8_t qh[4], qs[16];
        if (q51) {
          const auto blk = LoadBlock<BlockQ5_1>(src, b);
          d16 = blk.d;
          m16 = blk.m;
          std::memcpy(qh, blk.qh, 4);
          std::memcpy(qs, blk.qs, 16);
        } else {
          const auto blk = LoadBlock<BlockQ5_0>(src, b);
          d16 = blk.d;
          std::memcpy(qh, blk.qh, 4);
          std::memcpy(qs, blk.qs, 16);
        }
        const uint32_t h = HighBits(qh);
        const float d = F16ToF32(d16), m = F16ToF32(m16);
        for (int j = 0; j < 16; ++j) {
          const int q0 = (qs[j] & 15) | ((h >> j) & 1) << 4;
          const int q1 = (qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4;
          if (q51) {
            y[j] = static_cast<float>(q0) * d + m;
            y[j + 16] = static_cast<float>(q1) * d + m;
          } else {
            y[j] = static_cast<float>(q0 - 16) * d;
            y[j + 16] = static_cast<float>(q1 - 16) * d;
          }
        }
        break;
      }
      case TensorType::kQ2_K: {
        const auto blk = LoadBlock<BlockQ2_K>(src, b);
        const float d = F16ToF32(blk.d), dmin = F16ToF32(blk.dmin);
        for (int j = 0; j < 16; ++j) {
          const float dl = d * static_cast<float>(blk.scales[j] & 15);
          const float ml = dmin * static_cast<float>(blk.scales[j] >> 4);
          for (int l = 0; l < 16; ++l) {
            y[16 * j + l] = dl * static_cast<float>(Q2Field(blk.qs, 16 * j + l)) - ml;
          }
        }
        break;
      }
      case TensorType::kQ3_K: {
        const auto blk = LoadBlock<BlockQ3_K>(src, b);
        const float d = F16ToF32(blk.d);
        for (int j = 0; j < 16; ++j) {
          const float dl = d * static_cast<float>(Q3KScale(blk.scales, j) - 32);
          for (int l = 0; l < 16; ++l) {
            const int v = 16 * j + l;
            const int q = Q2Field(blk.qs, v) - (((blk.hmask[v % 32] >> (v / 32)) & 1) ? 0 : 4);
            y[v] = dl * static_cast<float>(q);
          }
        }
        break;
      }
      case TensorType::kQ4_K:
      case TensorType::kQ5_K: {
        const bool q5 = type == TensorType::kQ5_K;
        uint16_t d16, dmin16;
        uint8_t scales[12], qs[128], qh[32] = {};
        if (q5) {
          const auto blk = LoadBlock<BlockQ5_K>(src, b);
          d16 = blk.d;
          dmin16 = blk.dmin;
          std::memcpy(scales, blk.scales, 12);
          std::memcpy(qs, blk.qs, 128);
          std::memcpy(qh, blk.qh, 32);
        } else {
          const auto blk = LoadBlock<BlockQ4_K>(src, b);
          d16 = blk.d;
          dmin16 = blk.dmin;
          std::memcpy(scales, blk.scales, 12);
          std::memcpy(qs, blk.qs, 128);
        }
        const float d = F16ToF32(d16), dmin = F16ToF32(dmin16);
        for (int j = 0; j < 8; ++j) {
          int sc, m;
          Q4KScaleMin(scales, j, &sc, &m);
          const float dl = d * static_cast<float>(sc);
          const float ml = dmin * static_cast<float>(m);
          for (int l = 0; l < 32; ++l) {
            int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
            if (q5) q += ((qh[l] >> j) & 1) ? 16 : 0;
            y[32 * j + l] = dl * static_cast<float>(q) - ml;
          }
        }
        break;
      }
      case TensorType::kQ6_K: {
        const auto blk = LoadBlock<BlockQ6_K>(src, b);
        const float d = F16ToF32(blk.d);
        for (int v = 0; v < kQK; ++v) {
          const int nh = v / 128, c = (v % 128) / 32, l = v % 32;
          const int lo = (blk.ql[64 * nh + 32 * (c % 2) + l] >> (4 * (c / 2))) & 15;
          const int hi = (blk.qh[32 * nh + l] >> (2 * c)) & 3;
          y[v] = d * static_cast<float>(blk.scales[v / 16]) * static_cast<float>((lo | hi << 4) - 32);
        }
        break;
      }
      default:
        KV_CHECK(false, "DequantizeExtraRow: type {}", static_cast<uint32_t>(type));
    }
  }
}

}  // namespace kvasir::ref
