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
#include "kernels/quant_blocks.h"  // block layouts of the quantized types

namespace kvasir {

// ---- Number formats -------------------------------------------------------------------------
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);  // round to nearest even, as ggml
float BF16ToF32(uint16_t h);
uint16_t F32ToBF16(float f);  // round to nearest even; NaN stays NaN


// True for the types the kernels can dequantize and multiply: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1 (blocks of 32) and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (blocks of 256).
bool KernelsSupport(TensorType type);
std::string SupportedTypesList();  // "f32, f16, bf16, q8_0, q4_0, ...", for messages

// Values per block of `type` (1 for F32/F16/BF16, 32, or 256 for the K-quants).
int64_t BlockValues(TensorType type);

// Bytes of one row of `n` elements of `type` (n must be a multiple of the block size).
size_t RowBytes(TensorType type, int64_t n);

// Quantizes/converts `n` floats into `type` (n a multiple of the block size). Every type follows
// ggml's reference quantizer (quantize_row_*_ref): Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 take the scale from
// the extremes and round to nearest; the K-quants search sub-block scales (and mins) that minimise
// a weighted squared error, then quantize those scales with one f16 super-block scale.
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
// For quantized weights the activations are first quantized to Q8_0 blocks (as ggml does for Q8_0
// and Q4_0), and the products use integer dot products (kernels_ref.cpp defines the arithmetic);
// F16/BF16 weights are widened to f32. The result of a (row, token) does not depend on the batch,
// the thread count or the SIMD target (where fused multiply-add is available). Work is split over `pool`.
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
