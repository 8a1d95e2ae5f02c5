// The bf16 attention loops (kernels/attention_bf16.h) against double-precision sums of the
// bf16-rounded operands, on odd shapes, and a row's results independent of the rows batched with
// it. Skipped on CPUs without AVX512-BF16 (tests/expected_skips.txt).
#include "kernels/attention_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels_test_util.h"

namespace kvasir {
namespace {

using testing::RandomFloats;

constexpr int kHeadDims[] = {1, 17, 40, 64, 130};

#define SKIP_WITHOUT_BF16()                                                \
  if (!HaveBf16Attention()) GTEST_SKIP() << "this CPU has no AVX512-BF16"; \
  static_assert(true)

double Bf(float x) { return Bf16ToFloat(RoundToBf16(x)); }

TEST(AttentionBf16Test, RoundToBf16RoundsToNearestEvenAndFlushesSubnormals) {
  EXPECT_EQ(RoundToBf16(1.0f), 0x3f80);
  EXPECT_EQ(RoundToBf16(-2.0f), 0xc000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one, 1. Just above it rounds up.
  EXPECT_EQ(RoundToBf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(RoundToBf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up to the even one.
  EXPECT_EQ(RoundToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(RoundToBf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(RoundToBf16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(RoundToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(Bf16ToFloat(0x3f81), 1.0f + 0x1p-7f);
}

// Keys at a stride wider than a head (as a KV cache row holds every head), packed.
struct Keys {
  int n, hd;
  int64_t stride;
  std::vector<float> raw;        // [n, stride]
  std::vector<uint16_t> packed;  // [blocks, ceil(hd / 2), 16, 2]
  Keys(int n_keys, int head_dim, uint32_t seed)
      : n(n_keys), hd(head_dim), stride(head_dim + 3), raw(RandomFloats(n * stride, seed)) {
    packed.assign(static_cast<size_t>(Blocks() * Pairs() * 2 * kBf16KeyBlock), 0xffff);
    PackKeysBf16(raw.data(), stride, n, hd, packed.data());
  }
  int Blocks() const { return (n + kBf16KeyBlock - 1) / kBf16KeyBlock; }
  int Pairs() const { return (hd + 1) / 2; }
};

TEST(AttentionBf16Test, PackKeysRoundsAndTransposesPairsAndZeroPads) {
  SKIP_WITHOUT_BF16();
  for (int hd : kHeadDims) {
    for (int n : {1, 16, 37}) {
      Keys k(n, hd, 7);
      k.raw[0] = std::numeric_limits<float>::denorm_min();  // flushed, as the hardware does
      PackKeysBf16(k.raw.data(), k.stride, n, hd, k.packed.data());
      for (int j = 0; j < k.Blocks() * kBf16KeyBlock; ++j) {
        for (int d = 0; d < 2 * k.Pairs(); ++d) {
          const int64_t at = ((int64_t{j} / kBf16KeyBlock * k.Pairs() + d / 2) * kBf16KeyBlock +
                              j % kBf16KeyBlock) *
                                 2 +
                             d % 2;
          const uint16_t want = j < n && d < hd ? RoundToBf16(k.raw[j * k.stride + d]) : 0;
          ASSERT_EQ(k.packed[at], want) << "hd " << hd << " n " << n << " key " << j << " d " << d;
        }
      }
    }
  }
}

TEST(AttentionBf16Test, PackValuesInterleavesPairsOfKeys) {
  SKIP_WITHOUT_BF16();
  for (int hd : kHeadDims) {
    const int n = 37, w = Bf16ValueWidth(hd), pairs = (n + 1) / 2;
    const int64_t stride = hd + 5;
    const std::vector<float> v = RandomFloats(n * stride, 9);
    std::vector<uint16_t> packed(static_cast<size_t>(pairs) * w * 2, 0xffff);
    PackValuesBf16(v.data(), stride, n, 3, pairs, hd, packed.data());  // pairs 0-2 untouched
    for (int i = 0; i < pairs; ++i) {
      for (int d = 0; d < w; ++d) {
        for (int e = 0; e < 2; ++e) {
          const int j = 2 * i + e;
          const uint16_t want =
              i < 3 ? 0xffff : (j < n && d < hd ? RoundToBf16(v[j * stride + d]) : 0);
          ASSERT_EQ(packed[(int64_t{i} * w + d) * 2 + e], want) << hd << " " << j << " " << d;
        }
      }
    }
  }
}

// Scores within 1e-6 of sum |q||k| of a double dot product of the rounded operands; a row's scores
// bit-identical whether it is scored alone or among 7 rows.
TEST(AttentionBf16Test, KeyScoresMatchDoubleDotsAndDoNotDependOnTheBatch) {
  SKIP_WITHOUT_BF16();
  for (int hd : kHeadDims) {
    const int n_rows = 7, n_keys = 45;
    const Keys k(n_keys, hd, 11);
    const std::vector<float> q = RandomFloats(n_rows * hd, 12);
    const int width = k.Blocks() * kBf16KeyBlock;
    const float scale = 0.37f;
    std::vector<float> all(n_rows * width), one(width);
    KeyScoresBf16(q.data(), hd, n_rows, k.packed.data(), 0, k.Blocks(), hd, scale, all.data(),
                  width);
    for (int r = 0; r < n_rows; ++r) {
      KeyScoresBf16(q.data() + r * hd, hd, 1, k.packed.data(), 0, k.Blocks(), hd, scale, one.data(),
                    width);
      for (int j = 0; j < n_keys; ++j) {
        double want = 0, bound = 0;
        for (int d = 0; d < hd; ++d) {
          const double x = Bf(q[r * hd + d]) * Bf(k.raw[j * k.stride + d]);
          want += x;
          bound += std::fabs(x);
        }
        EXPECT_NEAR(all[r * width + j], want * scale, 1e-6 * bound * scale + 1e-30) << hd;
        ASSERT_EQ(all[r * width + j], one[j]) << "row " << r << " key " << j << " hd " << hd;
      }
    }
  }
}

// Each weight is exp(s - max) rounded to bf16 (within half a bf16 step, 2^-8 relative, plus the
// exponential's own 1e-6), keys outside the range and the pair's other half zero, and inv_sum the
// reciprocal of the weights' sum.
TEST(AttentionBf16Test, SoftmaxBf16RoundsTheUnnormalisedSoftmax) {
  SKIP_WITHOUT_BF16();
  for (auto [j0, j1] : {std::pair{0, 1}, std::pair{0, 16}, std::pair{3, 100}, std::pair{7, 1031}}) {
    const int n_rows = 3, width = 1040, stride = 530;
    const std::vector<float> s = RandomFloats(n_rows * width, 21, 6.0f);
    const int pairs = Bf16WeightPairs(j0, j1);
    std::vector<uint32_t> w(n_rows * stride, 0xdeadbeef);
    float inv_sum[n_rows];
    SoftmaxBf16(s.data(), width, n_rows, j0, j1, w.data(), stride, inv_sum);
    for (int r = 0; r < n_rows; ++r) {
      double max = -1e30, sum = 0;
      for (int j = j0; j < j1; ++j) max = std::max<double>(max, s[r * width + j]);
      for (int i = 0; i < pairs; ++i) {
        for (int e = 0; e < 2; ++e) {
          const int j = 2 * (j0 / 2 + i) + e;
          const uint32_t pair = w[r * stride + i];
          const double got = Bf16ToFloat(static_cast<uint16_t>(e == 0 ? pair : pair >> 16));
          sum += got;
          if (j < j0 || j >= j1) {
            ASSERT_EQ(got, 0.0) << j0 << ":" << j1 << " key " << j;
            continue;
          }
          const double want = std::exp(s[r * width + j] - max);
          EXPECT_NEAR(got, want, (0x1p-8 + 1e-6) * want) << j0 << ":" << j1 << " key " << j;
        }
      }
      EXPECT_EQ(w[r * stride + pairs], 0xdeadbeef);  // nothing past the row's pairs
      EXPECT_NEAR(inv_sum[r], 1.0 / sum, 1e-6 / sum) << j0 << ":" << j1;
    }
  }
}

// Weighted sums within 1e-6 of sum |w||v| of a double sum of the bf16 operands, from the pair
// holding j0; a row's output bit-identical whether computed alone or among 6 rows.
TEST(AttentionBf16Test, WeightedValuesMatchDoubleSumsAndDoNotDependOnTheBatch) {
  SKIP_WITHOUT_BF16();
  for (int hd : kHeadDims) {
    for (auto [j0, j1] : {std::pair{4, 50}, std::pair{5, 49}, std::pair{0, 1}, std::pair{3, 53}}) {
      const int n_rows = 6, n_keys = 53, width = 64, w_stride = 40, vw = Bf16ValueWidth(hd);
      const int64_t v_stride = hd + 5;
      const std::vector<float> v = RandomFloats(n_keys * v_stride, 31);
      const std::vector<float> s = RandomFloats(n_rows * width, 32);
      std::vector<uint32_t> w(n_rows * w_stride);
      float unused[n_rows];
      SoftmaxBf16(s.data(), width, n_rows, j0, j1, w.data(), w_stride, unused);
      const std::vector<float> scale = {1.0f, 0.5f, 2.0f, 0.25f, 3.0f, 1.5f};
      const int pairs = (n_keys + 1) / 2;
      std::vector<uint16_t> packed(static_cast<size_t>(pairs) * vw * 2);
      PackValuesBf16(v.data(), v_stride, n_keys, 0, pairs, hd, packed.data());
      std::vector<float> all(n_rows * hd), one(hd);
      WeightedValuesBf16(w.data(), w_stride, n_rows, j0, j1, packed.data(), hd, scale.data(),
                         all.data(), hd);
      for (int r = 0; r < n_rows; ++r) {
        WeightedValuesBf16(w.data() + r * w_stride, w_stride, 1, j0, j1, packed.data(), hd,
                           scale.data() + r, one.data(), hd);
        for (int d = 0; d < hd; ++d) {
          double want = 0, bound = 0;
          for (int j = j0; j < j1; ++j) {
            const int i = j / 2 - j0 / 2;
            const uint32_t pair = w[r * w_stride + i];
            const double wj = Bf16ToFloat(static_cast<uint16_t>(j % 2 == 0 ? pair : pair >> 16));
            const double x = wj * Bf(v[j * v_stride + d]);
            want += x;
            bound += std::fabs(x);
          }
          EXPECT_NEAR(all[r * hd + d], want * scale[r], 1e-6 * bound * scale[r] + 1e-30)
              << hd << " " << j0 << ":" << j1;
          ASSERT_EQ(all[r * hd + d], one[d]) << "row " << r << " d " << d << " hd " << hd;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvasir
