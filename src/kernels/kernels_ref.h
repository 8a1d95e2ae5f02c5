// Scalar reference implementations of the kernels in kernels.h: simple loops, f32 values with
// double accumulation where it matters. The tests compare every SIMD kernel against these.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace kvasir::ref {

void QuantizeRow(TensorType type, const float* src, int64_t n, void* dst);
void DequantizeRow(TensorType type, const void* src, int64_t n, float* dst);
void MatMul(const MatrixView& w, const float* x, int64_t n_tokens, float* y);
float DotF32(const float* a, const float* b, int64_t n);
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y);
void Softmax(float* x, int64_t n);
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

}  // namespace kvasir::ref
