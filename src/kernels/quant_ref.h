// Scalar reference quantizers and dequantizers of Q4_1, Q5_0, Q5_1 and the K-quants (Q2_K..Q6_K),
// behind ref::QuantizeRow / ref::DequantizeRow. Internal to the kernels.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace kvasir::ref {

// True for the types handled here.
bool IsExtraQuantType(TensorType type);
// n must be a multiple of the type's block size.
void QuantizeExtraRow(TensorType type, const float* src, int64_t n, void* dst);
// Gives exactly ggml's dequantize_row_* values (the same f32 operations, unfused).
void DequantizeExtraRow(TensorType type, const void* src, int64_t n, float* dst);

}  // namespace kvasir::ref
