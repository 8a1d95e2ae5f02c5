// Compute kernels on host memory: number formats, quantization, matrix-vector/matrix-matrix
// products and the element-wise ops of a transformer layer. Every SIMD path (Highway, dispatched at
// run time to the best target of this CPU) has a scalar reference with the same signature in
// kernels_ref.h; tests compare the two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"
#include "base/thread_pool.h"
#include "gguf/tensor_type.h"

namespace kvasir {

// ---- Number formats -------------------------------------------------------------------------
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);  // round to nearest even, as ggml
float BF16ToF32(uint16_t h);
uint16_t F32ToBF16(float f);  // round to nearest even; NaN stays NaN

// Block layouts (ggml-compatible, little-endian, packed).
#pragma pack(push, 1)
struct BlockQ8_0 {
  uint16_t d;     // f16 scale
  int8_t qs[32];  // value = d * qs[i]
};
struct BlockQ4_0 {
  uint16_t d;      // f16 scale
  uint8_t qs[16];  // element i (i<16) = low nibble of qs[i], element i+16 = high nibble; value = d*(q-8)
};
#pragma pack(pop)
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);

// True for the types the kernels can dequantize and multiply: F32, F16, BF16, Q8_0, Q4_0.
bool KernelsSupport(TensorType type);
std::string SupportedTypesList();  // "f32, f16, bf16, q8_0, q4_0", for messages

// Bytes of one row of `n` elements of `type` (n must be a multiple of the block size).
size_t RowBytes(TensorType type, int64_t n);

// Quantizes/converts `n` floats into `type` (n a multiple of the block size). Q8_0 and Q4_0 follow
// ggml's reference quantizers (scale from the absolute maximum, round to nearest).
void QuantizeRow(TensorType type, const float* src, int64_t n, void* dst);
// Dequantizes/converts `n` values of `type` to floats.
void DequantizeRow(TensorType type, const void* src, int64_t n, float* dst);

// ---- Matrix products ------------------------------------------------------------------------

// A weight matrix as stored in GGUF: `rows` rows of `cols` elements (ggml ne[1] x ne[0]), each row
// `row_bytes` apart. Not owned.
struct MatrixView {
  TensorType type = TensorType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
};

// y[t, r] = sum_i W[r, i] * x[t, i] for t < n_tokens, r < w.rows.
// x: [n_tokens, w.cols] f32 row-major. y: [n_tokens, w.rows] f32 row-major.
// For Q8_0/Q4_0 weights the activations are first quantized to Q8_0 blocks (as ggml does), and the
// products use integer dot products; F16/BF16 weights are widened to f32. Work is split over `pool`.
void MatMul(const MatrixView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);

// Row `r` of W dequantized into out[0, w.cols).
void GetRow(const MatrixView& w, int64_t r, float* out);

// ---- Element-wise and row ops ---------------------------------------------------------------

float DotF32(const float* a, const float* b, int64_t n);
// y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], for one row of n.
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y);
// In-place softmax over n values (max-subtracted, computed in f32 with a double sum).
void Softmax(float* x, int64_t n);
// out[i] = silu(gate[i]) * up[i].
void SiluMul(const float* gate, const float* up, int64_t n, float* out);
// y[i] += x[i].
void AddInPlace(float* y, const float* x, int64_t n);
// y[i] += a * x[i].
void Axpy(float a, const float* x, int64_t n, float* y);

// Name of the SIMD target chosen at run time ("AVX3_ZEN4", "AVX2", "NEON", ...).
std::string SimdTargetName();

}  // namespace kvasir
