// Quantizers and dequantizers: ggml block layouts, known values, error bounds, and the SIMD paths
// against the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"
#include "kernels_test_util.h"

namespace kvasir {
namespace {

using testing::ForEachSimdTarget;
using testing::RandomFloats;

TEST(QuantizeTest, Q8_0KnownValuesRoundHalfAwayFromZero) {
  // amax 127 gives d = 1, so q = roundf(x): halves go away from zero.
  std::vector<float> x(32, 0.0f);
  const float vals[] = {127.0f, -127.0f, 63.5f, -63.5f, 0.5f, -0.5f, 1.5f, 2.5f, -2.5f, 0.49f};
  const int8_t want[] = {127, -127, 64, -64, 1, -1, 2, 3, -3, 0};
  for (int i = 0; i < 10; ++i) x[i] = vals[i];
  ForEachSimdTarget([&](int64_t) {
    BlockQ8_0 simd;
    BlockQ8_0 ref;
    QuantizeRow(TensorType::kQ8_0, x.data(), 32, &simd);
    ref::QuantizeRow(TensorType::kQ8_0, x.data(), 32, &ref);
    EXPECT_EQ(simd.d, 0x3C00);
    EXPECT_EQ(ref.d, 0x3C00);
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(simd.qs[i], want[i]) << i;
      EXPECT_EQ(ref.qs[i], want[i]) << i;
    }
  });
}

TEST(QuantizeTest, Q4_0KnownValuesAndNibbleLayout) {
  // The largest magnitude is -8, so d = 1 and q = min(15, trunc(x + 8.5)).
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j % 16) - 8.0f;  // -8..7, twice
  x[5] = 0.5f;                                                            // rounds up: q = 9
  x[21] = -0.5f;                                                          // q = 8
  BlockQ4_0 blk;
  ref::QuantizeRow(TensorType::kQ4_0, x.data(), 32, &blk);
  QuantizeRow(TensorType::kQ4_0, x.data(), 32, &blk);
  EXPECT_EQ(blk.d, 0x3C00);
  for (int j = 0; j < 16; ++j) {
    const int want_lo = j == 5 ? 9 : j;
    const int want_hi = j == 5 ? 8 : j;  // element 21 is the high nibble of qs[5]
    EXPECT_EQ(blk.qs[j] & 0x0F, want_lo) << j;
    EXPECT_EQ(blk.qs[j] >> 4, want_hi) << j;
  }
  // Dequantization reads element j from the low nibble and j + 16 from the high nibble.
  BlockQ4_0 manual{};
  manual.d = F32ToF16(0.5f);
  for (int j = 0; j < 16; ++j) manual.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  ForEachSimdTarget([&](int64_t) {
    float out[32];
    DequantizeRow(TensorType::kQ4_0, &manual, 32, out);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(out[j], 0.5f * static_cast<float>(j - 8)) << j;
      EXPECT_EQ(out[j + 16], 0.5f * static_cast<float>(7 - j)) << j;
    }
  });
}

// The bounds below come from the input alone, never from the scale the quantizer stored (a wrong
// scale must fail, not widen its own bound), and hold at every magnitude. An f16 scale is within
// a relative 2^-11 of the exact one, or 2^-25 absolute where it is subnormal (below 2^-14).
constexpr float kF16Rel = 1.0f / 2048.0f;
float F16Err(float d) { return std::max(std::fabs(d) * kF16Rel, std::ldexp(1.0f, -25)); }

// Q8_0: d = amax / 127; |x - dq(x)| <= d/2 (the integer grid) + 127 * the f16 scale's error.
TEST(QuantizeTest, Q8_0RoundTripBound) {
  const int64_t n = 4096;
  for (float scale : {1e-3f, 3.0f, 1e3f}) {
    const std::vector<float> x = RandomFloats(n, 11, scale);
    std::vector<BlockQ8_0> blocks(n / 32);
    std::vector<float> back(n);
    ref::QuantizeRow(TensorType::kQ8_0, x.data(), n, blocks.data());
    ref::DequantizeRow(TensorType::kQ8_0, blocks.data(), n, back.data());
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      const float d = amax / 127.0f;
      EXPECT_LE(std::fabs(F16ToF32(blocks[b].d) - d), F16Err(d)) << "scale of block " << b;
      const float bound = d / 2 + 127.0f * F16Err(d) + 1e-6f * amax;
      for (int j = 0; j < 32; ++j) {
        EXPECT_LE(std::fabs(x[b * 32 + j] - back[b * 32 + j]), bound) << scale << " " << b << " " << j;
      }
    }
  }
}

// Q4_0: d = max / -8 with max the signed value of largest magnitude, q = round(x / d) + 8 clamped
// to 15. |x - dq(x)| <= |d|/2 on the grid, |d| where q was clamped, plus 8 * the f16 scale's error.
TEST(QuantizeTest, Q4_0RoundTripBound) {
  const int64_t n = 4096;
  for (float scale : {1e-3f, 3.0f, 1e3f}) {
    const std::vector<float> x = RandomFloats(n, 12, scale);
    std::vector<BlockQ4_0> blocks(n / 32);
    std::vector<float> back(n);
    ref::QuantizeRow(TensorType::kQ4_0, x.data(), n, blocks.data());
    ref::DequantizeRow(TensorType::kQ4_0, blocks.data(), n, back.data());
    for (int64_t b = 0; b < n / 32; ++b) {
      float max = 0.0f;
      for (int j = 0; j < 32; ++j) {
        if (std::fabs(x[b * 32 + j]) > std::fabs(max)) max = x[b * 32 + j];
      }
      const float d = max / -8.0f;
      EXPECT_LE(std::fabs(F16ToF32(blocks[b].d) - d), F16Err(d)) << "scale of block " << b;
      for (int j = 0; j < 32; ++j) {
        const bool clamped = x[b * 32 + j] / d + 8.0f >= 15.5f;
        const float bound =
            (clamped ? std::fabs(d) : std::fabs(d) / 2) + 8.0f * F16Err(d) + 1e-6f * std::fabs(d);
        EXPECT_LE(std::fabs(x[b * 32 + j] - back[b * 32 + j]), bound) << scale << " " << b << " " << j;
      }
    }
  }
}

TEST(QuantizeTest, SimdQuantizeMatchesReferenceBytes) {
  for (int64_t n : {32, 64, 96, 160, 4128}) {
    std::vector<float> x = RandomFloats(n, static_cast<uint32_t>(n), 2.0f);
    // Exercise exact halves, zeros and an all-zero block.
    for (int64_t i = 0; i < n; i += 7) x[i] = std::round(x[i] * 4.0f) / 4.0f;
    for (int64_t i = 0; i < 32 && n > 64; ++i) x[32 + i] = 0.0f;
    std::vector<BlockQ8_0> want(n / 32);
    ref::QuantizeRow(TensorType::kQ8_0, x.data(), n, want.data());
    ForEachSimdTarget([&](int64_t) {
      std::vector<BlockQ8_0> got(n / 32);
      QuantizeRow(TensorType::kQ8_0, x.data(), n, got.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(BlockQ8_0)), 0) << n;
    });
  }
}

TEST(QuantizeTest, SimdDequantizeMatchesReference) {
  for (TensorType type : testing::kAllTypes) {
    for (int64_t n0 : {32, 96, 160, 4128}) {
      const int64_t n = testing::FitCols(type, n0);
      SCOPED_TRACE(static_cast<int>(type));
      std::vector<float> x = RandomFloats(n, 3, 5.0f);
      if (type == TensorType::kF16 || type == TensorType::kBF16) {
        x[0] = std::numeric_limits<float>::infinity();
        x[1] = std::ldexp(1.0f, -20);  // f16 subnormal
        x[2] = -0.0f;
      }
      std::vector<uint8_t> bytes(RowBytes(type, n));
      ref::QuantizeRow(type, x.data(), n, bytes.data());
      std::vector<float> want(n);
      ref::DequantizeRow(type, bytes.data(), n, want.data());
      ForEachSimdTarget([&](int64_t) {
        std::vector<float> got(n);
        DequantizeRow(type, bytes.data(), n, got.data());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
      });
    }
  }
}

TEST(QuantizeTest, F16AndBf16QuantizeRowConvert) {
  const float x[4] = {1.0f, 65504.0f, -0.5f, 3.0f};
  uint16_t h[4];
  QuantizeRow(TensorType::kF16, x, 4, h);
  EXPECT_EQ(h[0], 0x3C00);
  EXPECT_EQ(h[1], 0x7BFF);
  QuantizeRow(TensorType::kBF16, x, 4, h);
  EXPECT_EQ(h[0], 0x3F80);
  EXPECT_EQ(h[2], 0xBF00);
}

TEST(QuantizeTest, GetRowDequantizesOneRow) {
  for (TensorType type : testing::kAllTypes) {
    const int64_t cols = testing::FitCols(type, 96);
    const testing::TestMatrix m = testing::MakeMatrix(type, 5, cols, 21, /*extra_row_bytes=*/6);
    std::vector<float> row(cols);
    for (int64_t r = 0; r < 5; ++r) {
      GetRow(m.view, r, row.data());
      for (int64_t i = 0; i < cols; ++i) EXPECT_EQ(row[i], m.dequantized[r * cols + i]);
    }
  }
}

}  // namespace
}  // namespace kvasir
