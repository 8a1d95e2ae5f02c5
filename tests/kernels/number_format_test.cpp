// F16/BF16 conversions (known values, exhaustive round trips, agreement with the F16C instructions)
// and row geometry.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define KV_TEST_F16C 1
#else
#define KV_TEST_F16C 0
#endif

namespace kvasir {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

TEST(F16Test, KnownValues) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3C00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xC000);
  EXPECT_EQ(F32ToF16(0.0f), 0x0000);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);  // largest half
  EXPECT_EQ(F32ToF16(65519.0f), 0x7BFF);  // below the midpoint to 65536
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);  // the midpoint rounds to even: infinity
  EXPECT_EQ(F32ToF16(1e6f), 0x7C00);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24: even
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -24)), 0x0002);  // tie between 1 and 2 ulps: even
  EXPECT_EQ(F32ToF16(std::ldexp(1.25f, -24)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(1023.0f, -24)), 0x03FF);      // largest subnormal
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie: even
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(F32ToF16(-std::numeric_limits<float>::infinity()), 0xFC00);
  const uint16_t nan = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);

  EXPECT_EQ(F16ToF32(0x3C00), 1.0f);
  EXPECT_EQ(F16ToF32(0x7BFF), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(F16ToF32(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isinf(F16ToF32(0x7C00)) && F16ToF32(0x7C00) > 0);
  EXPECT_TRUE(std::isinf(F16ToF32(0xFC00)) && F16ToF32(0xFC00) < 0);
  EXPECT_TRUE(std::isnan(F16ToF32(0x7E00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7C01)));  // signaling NaN stays NaN
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)) && F16ToF32(0x8000) == 0.0f);
}

TEST(F16Test, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f)))) << h;
    } else {
      EXPECT_EQ(F32ToF16(f), h) << h;
    }
  }
}

// Every f32 value between two adjacent halves rounds to the nearer one (ties to even).
TEST(F16Test, RoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x7BFF; h += 7) {
    const double lo = F16ToF32(static_cast<uint16_t>(h));
    const double hi = F16ToF32(static_cast<uint16_t>(h + 1));
    const double mid = (lo + hi) / 2;
    EXPECT_EQ(F32ToF16(static_cast<float>(mid)), (h & 1) ? h + 1 : h) << h;
    EXPECT_EQ(F32ToF16(std::nextafter(static_cast<float>(mid), 0.0f)), h) << h;
    EXPECT_EQ(F32ToF16(std::nextafter(static_cast<float>(mid), 1e9f)), h + 1) << h;
  }
}

#if KV_TEST_F16C
__attribute__((target("f16c"))) uint16_t HardwareF32ToF16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float HardwareF16ToF32(uint16_t h) { return _cvtsh_ss(h); }

bool CpuHasF16c() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}

TEST(F16Test, MatchesF16cInstructions) {
  if (!CpuHasF16c()) GTEST_SKIP() << "CPU without F16C";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = HardwareF16ToF32(static_cast<uint16_t>(h));
    const float got = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(Bits(got), Bits(want)) << h;
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns, biased towards the exponents where halves live.
    uint32_t u = rng();
    if (i % 2 == 0) u = (u & 0x807FFFFFu) | ((100u + (u >> 23) % 45u) << 23);
    const float f = FromBits(u);
    ASSERT_EQ(F32ToF16(f), HardwareF32ToF16(f)) << std::hex << u;
  }
}
#endif

TEST(BF16Test, KnownValuesAndRounding) {
  EXPECT_EQ(F32ToBF16(1.0f), 0x3F80);
  EXPECT_EQ(F32ToBF16(-2.0f), 0xC000);
  EXPECT_EQ(F32ToBF16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie: even
  EXPECT_EQ(F32ToBF16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie: even
  EXPECT_EQ(F32ToBF16(1.0f + std::ldexp(1.0f, -9)), 0x3F80);
  EXPECT_EQ(F32ToBF16(1.0f + std::ldexp(1.5f, -8)), 0x3F81);
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to infinity
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(FromBits(0x7F800001u)))));  // low payload kept NaN
  EXPECT_EQ(BF16ToF32(0x3F80), 1.0f);
  EXPECT_EQ(BF16ToF32(0x4049), 3.140625f);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = BF16ToF32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(F32ToBF16(f), h) << h;
    }
  }
}

TEST(RowBytesTest, Geometry) {
  EXPECT_EQ(RowBytes(TensorType::kF32, 10), 40u);
  EXPECT_EQ(RowBytes(TensorType::kF16, 10), 20u);
  EXPECT_EQ(RowBytes(TensorType::kBF16, 10), 20u);
  EXPECT_EQ(RowBytes(TensorType::kQ8_0, 64), 68u);
  EXPECT_EQ(RowBytes(TensorType::kQ4_0, 4096), 128u * 18u);
  EXPECT_TRUE(KernelsSupport(TensorType::kQ4_0));
  EXPECT_TRUE(KernelsSupport(TensorType::kQ4_K));
  EXPECT_TRUE(KernelsSupport(TensorType::kQ6_K));
  EXPECT_FALSE(KernelsSupport(TensorType::kIQ2_XXS));
  EXPECT_FALSE(KernelsSupport(TensorType::kQ8_K));
  EXPECT_EQ(SupportedTypesList(),
            "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k");
}

}  // namespace
}  // namespace kvasir
