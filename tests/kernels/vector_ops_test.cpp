// Element-wise and row operations on every SIMD target against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"
#include "kernels_test_util.h"

namespace kvasir {
namespace {

using testing::ForEachSimdTarget;
using testing::RandomFloats;

constexpr int64_t kSizes[] = {0, 1, 7, 16, 33, 100, 2048, 4099};

// Tolerance 1e-5 of sum |a||b|: f32 accumulation against a double sum.
TEST(VectorOpsTest, DotF32) {
  for (int64_t n : kSizes) {
    const std::vector<float> a = RandomFloats(n, 1);
    const std::vector<float> b = RandomFloats(n, 2);
    double abs_sum = 0.0;
    for (int64_t i = 0; i < n; ++i) abs_sum += std::fabs(a[i] * b[i]);
    const float want = ref::DotF32(a.data(), b.data(), n);
    ForEachSimdTarget([&](int64_t) {
      EXPECT_NEAR(DotF32(a.data(), b.data(), n), want, 1e-5 * abs_sum + 1e-30) << n;
    });
  }
}

// Relative 1e-5 per element: the scale may differ in its last bits from the reference's.
TEST(VectorOpsTest, RmsNorm) {
  for (int64_t n : kSizes) {
    if (n == 0) continue;
    const std::vector<float> x = RandomFloats(n, 3, 4.0f);
    const std::vector<float> w = RandomFloats(n, 4);
    std::vector<float> want(n);
    ref::RmsNorm(x.data(), w.data(), n, 1e-5f, want.data());
    ForEachSimdTarget([&](int64_t) {
      std::vector<float> got(n);
      RmsNorm(x.data(), w.data(), n, 1e-5f, got.data());
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i])) << i;
      std::vector<float> in_place = x;
      RmsNorm(in_place.data(), w.data(), n, 1e-5f, in_place.data());
      EXPECT_EQ(in_place, got);
    });
  }
}

// Relative 1e-5 per probability (plus 1e-12 absolute); masked (-inf) entries are exactly zero.
TEST(VectorOpsTest, Softmax) {
  for (int64_t n : kSizes) {
    if (n == 0) continue;
    std::vector<float> x = RandomFloats(n, 5, 8.0f);
    for (int64_t i = 1; i < n; i += 5) x[i] = -std::numeric_limits<float>::infinity();
    if (n > 3) x[3] = -200.0f;  // far below the max: underflows to zero
    std::vector<float> want = x;
    ref::Softmax(want.data(), n);
    ForEachSimdTarget([&](int64_t) {
      std::vector<float> got = x;
      Softmax(got.data(), n);
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-5 * want[i] + 1e-12) << i;
        if (std::isinf(x[i])) {
          EXPECT_EQ(got[i], 0.0f) << i;
        }
        sum += got[i];
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    });
  }
}

// Relative 1e-5 per element (plus 1e-30 absolute for results that underflow).
TEST(VectorOpsTest, SiluMul) {
  for (int64_t n : kSizes) {
    std::vector<float> gate = RandomFloats(n, 6, 5.0f);
    if (n > 4) {
      gate[0] = -100.0f;
      gate[1] = 100.0f;
      gate[2] = 0.0f;
      gate[3] = -20.0f;
    }
    const std::vector<float> up = RandomFloats(n, 7);
    std::vector<float> want(n);
    ref::SiluMul(gate.data(), up.data(), n, want.data());
    ForEachSimdTarget([&](int64_t) {
      std::vector<float> got(n);
      SiluMul(gate.data(), up.data(), n, got.data());
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-30) << i;
      }
    });
  }
}

// A value's result does not depend on where it lies in the buffer: rows of 172 (not a multiple of
// any vector width) give the same bits in a batch of 3 rows as alone. Batched and single-session
// forward passes rely on this.
TEST(VectorOpsTest, SiluMulIsIndependentOfPosition) {
  constexpr int64_t kWidth = 172, kRows = 3;
  const std::vector<float> gate = RandomFloats(kWidth * kRows, 10, 5.0f);
  const std::vector<float> up = RandomFloats(kWidth * kRows, 11);
  ForEachSimdTarget([&](int64_t) {
    std::vector<float> all(kWidth * kRows), one(kWidth);
    SiluMul(gate.data(), up.data(), kWidth * kRows, all.data());
    for (int64_t r = 0; r < kRows; ++r) {
      SiluMul(gate.data() + r * kWidth, up.data() + r * kWidth, kWidth, one.data());
      for (int64_t i = 0; i < kWidth; ++i) ASSERT_EQ(one[i], all[r * kWidth + i]) << r << "," << i;
    }
  });
}

TEST(VectorOpsTest, AddInPlaceAndAxpy) {
  for (int64_t n : kSizes) {
    const std::vector<float> x = RandomFloats(n, 8);
    const std::vector<float> y0 = RandomFloats(n, 9);
    ForEachSimdTarget([&](int64_t) {
      std::vector<float> y = y0;
      AddInPlace(y.data(), x.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], y0[i] + x[i]) << i;
      // Axpy may fuse the multiply-add: within one rounding of a * x.
      y = y0;
      Axpy(0.37f, x.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) {
        const double want = static_cast<double>(y0[i]) + 0.37 * x[i];
        EXPECT_NEAR(y[i], want, 1e-6 * (std::fabs(y0[i]) + std::fabs(0.37 * x[i]))) << i;
      }
    });
  }
}

TEST(VectorOpsTest, SimdTargetNameIsKnown) {
  const std::string name = SimdTargetName();
  EXPECT_FALSE(name.empty());
  EXPECT_NE(name, "Unknown");
  std::printf("SIMD target: %s\n", name.c_str());
  // Forcing a target really changes where the kernels dispatch (the other tests rely on it).
  int count = 0;
  ForEachSimdTarget([&](int64_t target) {
    EXPECT_EQ(SimdTargetName(), kernels_internal::SimdTargetNameOf(target));
    std::printf("  testing target %s\n", SimdTargetName().c_str());
    ++count;
  });
  EXPECT_GE(count, 1);
  EXPECT_EQ(SimdTargetName(), name);
}

}  // namespace
}  // namespace kvasir
