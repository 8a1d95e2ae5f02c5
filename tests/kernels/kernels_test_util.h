// Helpers for the kernel tests: random data, weight matrices in every supported type, and running a
// check once per SIMD target this CPU supports.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"
#include "kernels/simd_target.h"

namespace kvasir::testing {

inline std::vector<float> RandomFloats(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// A weight matrix of `type` made from random floats with the reference quantizer. Row scales vary
// over four orders of magnitude, and row 1 (when present) has an all-zero block.
struct TestMatrix {
  std::vector<uint8_t> bytes;
  MatrixView view;
  std::vector<float> dequantized;  // [rows, cols] f32
};

inline TestMatrix MakeMatrix(TensorType type, int64_t rows, int64_t cols, uint32_t seed,
                             size_t extra_row_bytes = 0) {
  TestMatrix m;
  const size_t row_bytes = RowBytes(type, cols) + extra_row_bytes;
  m.bytes.assign(row_bytes * static_cast<size_t>(rows), 0xEE);
  std::vector<float> src = RandomFloats(rows * cols, seed);
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::pow(10.0f, static_cast<float>(r % 5) - 2.0f);
    for (int64_t i = 0; i < cols; ++i) src[r * cols + i] *= row_scale;
    if (r == 1 && cols >= 64) {
      for (int64_t i = 32; i < 64; ++i) src[r * cols + i] = 0.0f;
    }
    ref::QuantizeRow(type, src.data() + r * cols, cols, m.bytes.data() + r * row_bytes);
  }
  m.view = MatrixView{type, m.bytes.data(), rows, cols, row_bytes};
  m.dequantized.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    ref::DequantizeRow(type, m.bytes.data() + r * row_bytes, cols, m.dequantized.data() + r * cols);
  }
  return m;
}

// Calls fn() once per SIMD target compiled in and supported here, with the kernels forced to that
// target, then restores automatic dispatch.
template <typename Fn>
void ForEachSimdTarget(Fn&& fn) {
  for (int64_t target : kernels_internal::AvailableSimdTargets()) {
    kernels_internal::ForceSimdTarget(target);
    SCOPED_TRACE(kernels_internal::SimdTargetNameOf(target));
    fn(target);
  }
  kernels_internal::ForceSimdTarget(0);
}

inline constexpr TensorType kAllTypes[] = {
    TensorType::kF32,  TensorType::kF16,  TensorType::kBF16, TensorType::kQ8_0, TensorType::kQ4_0,
    TensorType::kQ4_1, TensorType::kQ5_0, TensorType::kQ5_1, TensorType::kQ2_K, TensorType::kQ3_K,
    TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K};

inline bool IsQuantized(TensorType t) { return BlockValues(t) > 1; }

// `cols` rounded up to a whole number of the type's blocks (256 for the K-quants, whose tests then
// see the same shapes with 256 in place of 32).
inline int64_t FitCols(TensorType t, int64_t cols) {
  const int64_t b = BlockValues(t);
  return (cols + b - 1) / b * b;
}

}  // namespace kvasir::testing
