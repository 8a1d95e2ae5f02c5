// Scalar reference kernels: plain loops that spell out the arithmetic the SIMD paths must match.
#include "kernels/kernels_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/quant_ints.h"
#include "kernels/quant_ref.h"

namespace kvasir::ref {
namespace {

constexpr int kBlock = 32;

void QuantizeQ8_0(const float* src, int64_t n, BlockQ8_0* dst) {
  for (int64_t b = 0; b < n / kBlock; ++b) {
    const float* x = src + b * kBlock;
    float amax = 0.0f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[b].d = F32ToF16(d);
    for (int j = 0; j < kBlock; ++j) dst[b].qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
  }
}

void QuantizeQ4_0(const float* src, int64_t n, BlockQ4_0* dst) {
  for (int64_t b = 0; b < n / kBlock; ++b) {
    const float* x = src + b * kBlock;
    // The signed value of largest magnitude maps to -8, so the full range [-8, 7] is used.
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kBlock; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[b].d = F32ToF16(d);
    for (int j = 0; j < kBlock / 2; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      dst[b].qs[j] = static_cast<uint8_t>(lo | hi << 4);
    }
  }
}

// Signed value of element j of a Q4_0 block.
int Q4Value(const BlockQ4_0& blk, int j) {
  return j < 16 ? (blk.qs[j] & 0x0F) - 8 : (blk.qs[j - 16] >> 4) - 8;
}

float FloatWeight(TensorType type, const void* row, int64_t i) {
  switch (type) {
    case TensorType::kF32: {
      float f;  // rows may be unaligned (any row stride is allowed)
      std::memcpy(&f, static_cast<const uint8_t*>(row) + 4 * i, sizeof(f));
      return f;
    }
    case TensorType::kF16:
    case TensorType::kBF16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(row) + 2 * i, sizeof(h));
      return type == TensorType::kF16 ? F16ToF32(h) : BF16ToF32(h);
    }
    default:
      KV_CHECK(false, "not a float type");
  }
  return 0.0f;
}

}  // namespace

void QuantizeRow(TensorType type, const float* src, int64_t n, void* dst) {
  switch (type) {
    case TensorType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case TensorType::kF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = F32ToF16(src[i]);
      return;
    case TensorType::kBF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = F32ToBF16(src[i]);
      return;
    case TensorType::kQ8_0:
      KV_CHECK(n % kBlock == 0, "q8_0 row of {} values", n);
      QuantizeQ8_0(src, n, static_cast<BlockQ8_0*>(dst));
      return;
    case TensorType::kQ4_0:
      KV_CHECK(n % kBlock == 0, "q4_0 row of {} values", n);
      QuantizeQ4_0(src, n, static_cast<BlockQ4_0*>(dst));
      return;
    default:
      KV_CHECK(IsExtraQuantType(type), "QuantizeRow: unsupported type {}",
               static_cast<uint32_t>(type));
      QuantizeExtraRow(type, src, n, dst);
  }
}

void DequantizeRow(TensorType type, const void* src, int64_t n, float* dst) {
  switch (type) {
    case TensorType::kF32:
    case TensorType::kF16:
    case TensorType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = FloatWeight(type, src, i);
      return;
    case TensorType::kQ8_0: {
      const auto* blk = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = F16ToF32(blk[i / kBlock].d) * static_cast<float>(blk[i / kBlock].qs[i % kBlock]);
      }
      return;
    }
    case TensorType::kQ4_0: {
      const auto* blk = static_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < n; ++i) {
        const BlockQ4_0& b = blk[i / kBlock];
        dst[i] = F16ToF32(b.d) * static_cast<float>(Q4Value(b, static_cast<int>(i % kBlock)));
      }
      return;
    }
    default:
      KV_CHECK(IsExtraQuantType(type), "DequantizeRow: unsupported type {}",
               static_cast<uint32_t>(type));
      DequantizeExtraRow(type, src, n, dst);
  }
}

// Quantized weights: every activation row becomes Q8_0 blocks, and every weight block of 32 its
// integer form; quant_ints.h defines the arithmetic (for Q8_0/Q4_0 it is one fused multiply-add
// per block, acc = fma(float(isum_b), dw_b * dx_b, acc)). The SIMD kernels perform exactly these
// operations for every (row, token).
void MatMul(const MatrixView& w, const float* x, int64_t n_tokens, float* y) {
  const int64_t cols = w.cols;
  const auto* base = static_cast<const uint8_t*>(w.data);
  if (kernels_internal::IsQuantizedType(w.type)) {
    const int64_t nb = cols / kBlock;
    const kernels_internal::MinKind kind = kernels_internal::MinKindOf(w.type);
    std::vector<BlockQ8_0> xq(static_cast<size_t>(nb));
    std::vector<int32_t> sum(static_cast<size_t>(nb)), sum_lo(static_cast<size_t>(nb));
    std::vector<float> dx(static_cast<size_t>(nb)), fsum(static_cast<size_t>(nb));
    kernels_internal::IntBlock blk;
    for (int64_t t = 0; t < n_tokens; ++t) {
      QuantizeQ8_0(x + t * cols, cols, xq.data());
      for (int64_t b = 0; b < nb; ++b) {
        sum[b] = sum_lo[b] = 0;
        for (int j = 0; j < kBlock; ++j) {
          sum[b] += xq[b].qs[j];
          if (j < 16) sum_lo[b] += xq[b].qs[j];
        }
        dx[b] = F16ToF32(xq[b].d);
        fsum[b] = dx[b] * static_cast<float>(sum[b]);
      }
      for (int64_t r = 0; r < w.rows; ++r) {
        const uint8_t* row = base + static_cast<size_t>(r) * w.row_bytes;
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          kernels_internal::DecodeIntBlock(w.type, row, b, &blk);
          acc = kernels_internal::IntBlockStep(blk, kind, xq[b].qs, dx[b], sum[b], sum_lo[b],
                                               fsum[b], acc);
        }
        y[t * w.rows + r] = acc;
      }
    }
    return;
  }
  KV_CHECK(w.type == TensorType::kF32 || w.type == TensorType::kF16 || w.type == TensorType::kBF16,
           "ref::MatMul: unsupported type {}", static_cast<uint32_t>(w.type));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < w.rows; ++r) {
      const uint8_t* row = base + static_cast<size_t>(r) * w.row_bytes;
      double acc = 0.0;
      for (int64_t i = 0; i < cols; ++i) {
        acc += static_cast<double>(FloatWeight(w.type, row, i)) * x[t * cols + i];
      }
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

float DotF32(const float* a, const float* b, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(acc);
}

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace kvasir::ref
