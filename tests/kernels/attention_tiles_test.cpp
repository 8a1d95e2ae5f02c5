// The attention inner loops on every SIMD target: against double-precision references, and a
// row's results independent of the rows batched with it (decode and prefill must agree).
#include "kernels/attention_tiles.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels_test_util.h"

namespace kvasir {
namespace {

using testing::ForEachSimdTarget;
using testing::RandomFloats;

constexpr int kHeadDims[] = {1, 17, 40, 64, 130};

// Keys at a stride wider than a head (as a KV cache row holds every head), packed.
struct Keys {
  int n, hd;
  int64_t stride;
  std::vector<float> raw;     // [n, stride]
  std::vector<float> packed;  // [blocks, hd, kKeyBlock]
  Keys(int n_keys, int head_dim, uint32_t seed)
      : n(n_keys), hd(head_dim), stride(head_dim + 3), raw(RandomFloats(n * stride, seed)) {
    packed.assign(static_cast<size_t>(Blocks() * hd * kKeyBlock), -1.0f);
    PackKeys(raw.data(), stride, n, hd, packed.data());
  }
  int Blocks() const { return (n + kKeyBlock - 1) / kKeyBlock; }
};

TEST(AttentionTilesTest, PackKeysTransposesBlocksAndZeroPadsTheLast) {
  for (int hd : kHeadDims) {
    for (int n : {1, 16, 37}) {
      ForEachSimdTarget([&](int64_t) {
        const Keys k(n, hd, 7);
        for (int j = 0; j < k.Blocks() * kKeyBlock; ++j) {
          for (int d = 0; d < hd; ++d) {
            const float got =
                k.packed[(j / kKeyBlock) * hd * kKeyBlock + d * kKeyBlock + j % kKeyBlock];
            ASSERT_EQ(got, j < n ? k.raw[j * k.stride + d] : 0.0f) << hd << " " << n << " " << j;
          }
        }
      });
    }
  }
}

// Scores within 1e-6 of sum |q||k| of a double dot product; a row's scores bit-identical whether
// it is scored alone or among 7 rows.
TEST(AttentionTilesTest, KeyScoresMatchDoubleDotsAndDoNotDependOnTheBatch) {
  for (int hd : kHeadDims) {
    const int n_rows = 7, n_keys = 45;
    const Keys k(n_keys, hd, 11);
    const std::vector<float> q = RandomFloats(n_rows * hd, 12);
    const int width = k.Blocks() * kKeyBlock;
    const float scale = 0.37f;
    ForEachSimdTarget([&](int64_t) {
      std::vector<float> all(n_rows * width), one(width);
      KeyScores(q.data(), hd, n_rows, k.packed.data(), 0, k.Blocks(), hd, scale, all.data(), width);
      for (int r = 0; r < n_rows; ++r) {
        KeyScores(q.data() + r * hd, hd, 1, k.packed.data(), 0, k.Blocks(), hd, scale, one.data(),
                  width);
        for (int j = 0; j < n_keys; ++j) {
          double want = 0, bound = 0;
          for (int d = 0; d < hd; ++d) {
            want += double{q[r * hd + d]} * k.raw[j * k.stride + d];
            bound += std::fabs(double{q[r * hd + d]} * k.raw[j * k.stride + d]);
          }
          EXPECT_NEAR(all[r * width + j], want * scale, 1e-6 * bound * scale + 1e-30) << hd;
          ASSERT_EQ(all[r * width + j], one[j]) << "row " << r << " key " << j << " hd " << hd;
        }
      }
    });
  }
}

TEST(AttentionTilesTest, ExpScoresIsTheUnnormalisedSoftmax) {
  for (int n : {1, 5, 16, 100, 1031}) {
    const std::vector<float> s = RandomFloats(n, 21, 6.0f);
    double max = s[0];
    for (float x : s) max = std::max<double>(max, x);
    double sum = 0;
    for (float x : s) sum += std::exp(x - max);
    ForEachSimdTarget([&](int64_t) {
      std::vector<float> got = s;
      const float inv = ExpScores(got.data(), n);
      EXPECT_NEAR(inv, 1.0 / sum, 1e-6 / sum) << n;
      for (int j = 0; j < n; ++j) EXPECT_NEAR(got[j], std::exp(s[j] - max), 2e-6) << n;
    });
  }
}

// Weighted sums of value rows within 1e-6 of sum |p||v| of a double sum; a row's output
// bit-identical whether computed alone or among 6 rows.
TEST(AttentionTilesTest, WeightedValuesMatchDoubleSumsAndDoNotDependOnTheBatch) {
  for (int hd : kHeadDims) {
    const int n_rows = 6, n_keys = 53, j0 = 4, j1 = 50, width = 64;
    const int64_t v_stride = hd + 5;
    const std::vector<float> v = RandomFloats(n_keys * v_stride, 31);
    const std::vector<float> p = RandomFloats(n_rows * width, 32);
    const std::vector<float> scale = {1.0f, 0.5f, 2.0f, 0.25f, 3.0f, 1.5f};
    ForEachSimdTarget([&](int64_t) {
      std::vector<float> all(n_rows * hd), one(hd);
      WeightedValues(p.data(), width, n_rows, j0, j1, v.data(), v_stride, hd, scale.data(),
                     all.data(), hd);
      for (int r = 0; r < n_rows; ++r) {
        WeightedValues(p.data() + r * width, width, 1, j0, j1, v.data(), v_stride, hd,
                       scale.data() + r, one.data(), hd);
        for (int d = 0; d < hd; ++d) {
          double want = 0, bound = 0;
          for (int j = j0; j < j1; ++j) {
            want += double{p[r * width + j]} * v[j * v_stride + d];
            bound += std::fabs(double{p[r * width + j]} * v[j * v_stride + d]);
          }
          EXPECT_NEAR(all[r * hd + d], want * scale[r], 1e-6 * bound * scale[r]) << hd;
          ASSERT_EQ(all[r * hd + d], one[d]) << "row " << r << " d " << d << " hd " << hd;
        }
      }
    });
  }
}

}  // namespace
}  // namespace kvasir
