// The device layout of a weight matrix (cuda_blocks.h describes it) and the host-side repacking of
// a file's rows into it. Host code only: the backend repacks one matrix into a host buffer and
// copies it to the device once, at load.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_blocks.h"
#include "kernels/kernels.h"

namespace kvasir::cuda {

// The weight types this backend multiplies: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
// Q5_K, Q6_K (every type of the CPU kernels but Q2_K and Q3_K).
bool CudaSupportsType(TensorType type);
std::vector<TensorType> CudaTypes();

// Sizes of one matrix of `type` [rows, cols] in device layout.
struct DeviceLayout {
  int64_t row_bytes = 0;  // DevMatrix::row_bytes
  int64_t heads = 0;      // DevMatrix::heads (split types), else 0
  int64_t bytes = 0;      // the whole matrix, rounded up to 256 (DevMatrix::stride of a stack)
};
// type must be CudaSupportsType, cols a multiple of its block.
DeviceLayout LayoutOf(TensorType type, int64_t rows, int64_t cols);

// Writes the matrix `src` (the file's layout, rows src.row_bytes apart) in device layout into
// dst [layout.bytes].
void Repack(const MatrixView& src, const DeviceLayout& layout, uint8_t* dst);

}  // namespace kvasir::cuda
