// MatMul on every SIMD target against the reference, across odd shapes, thread counts, batch vs
// per-token processing, and against an exact product to bound the activation quantization error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"
#include "kernels_test_util.h"

namespace kvasir {
namespace {

using testing::FitCols;
using testing::ForEachSimdTarget;
using testing::IsQuantized;
using testing::kAllTypes;
using testing::MakeMatrix;
using testing::RandomFloats;
using testing::TestMatrix;

constexpr int64_t kCols[] = {32, 64, 96, 160, 4096 + 32};
constexpr int64_t kKCols[] = {256, 512, 768, 4096 + 256};  // for the K-quants
constexpr int64_t kRows[] = {1, 3, 7, 67, 257};
constexpr int64_t kTokens[] = {1, 2, 3, 5, 17};

std::string TypeName(TensorType t) { return TensorTypeName(static_cast<uint32_t>(t)); }

// Targets whose MulAdd is a fused multiply-add, like std::fma in the reference.
bool HasFusedMulAdd(int64_t target) {
  const std::string name = kernels_internal::SimdTargetNameOf(target);
  return name != "SSE4" && name != "SSSE3" && name != "EMU128" && name != "SCALAR";
}

// sum_i |W[r, i]| * |x[t, i]| for every (t, r): the magnitude tolerances are relative to.
std::vector<double> AbsProducts(const TestMatrix& m, const std::vector<float>& x, int64_t n) {
  const int64_t rows = m.view.rows;
  const int64_t cols = m.view.cols;
  std::vector<double> out(static_cast<size_t>(n * rows));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0.0;
      for (int64_t i = 0; i < cols; ++i) {
        s += std::fabs(static_cast<double>(m.dequantized[r * cols + i]) * x[t * cols + i]);
      }
      out[t * rows + r] = s;
    }
  }
  return out;
}

std::vector<float> RunMatMul(const MatrixView& w, const std::vector<float>& x, int64_t n,
                             ThreadPool& pool) {
  std::vector<float> y(static_cast<size_t>(n * w.rows), -1.0f);
  MatMul(w, x.data(), n, y.data(), pool);
  return y;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Tolerance: 1e-5 of sum |w||x|. Integer paths differ from the reference only in where f32
// roundings happen (nowhere, on fused targets); float paths accumulate in f32 against a double sum.
TEST(MatMulTest, MatchesReferenceOnOddShapes) {
  ThreadPool pool(2);
  uint32_t seed = 1;
  for (TensorType type : kAllTypes) {
    const bool k_quant = BlockValues(type) == kSuperBlock;
    for (int64_t cols : k_quant ? std::vector<int64_t>(std::begin(kKCols), std::end(kKCols))
                                : std::vector<int64_t>(std::begin(kCols), std::end(kCols))) {
      for (int64_t rows : kRows) {
        for (int64_t n : kTokens) {
          SCOPED_TRACE(TypeName(type) + " rows " + std::to_string(rows) + " cols " +
                       std::to_string(cols) + " tokens " + std::to_string(n));
          const TestMatrix m = MakeMatrix(type, rows, cols, ++seed);
          const std::vector<float> x = RandomFloats(n * cols, ++seed);
          std::vector<float> want(static_cast<size_t>(n * rows));
          ref::MatMul(m.view, x.data(), n, want.data());
          const std::vector<double> scale = AbsProducts(m, x, n);
          ForEachSimdTarget([&](int64_t target) {
            const std::vector<float> got = RunMatMul(m.view, x, n, pool);
            int bad = 0;
            for (size_t i = 0; i < got.size() && bad < 3; ++i) {
              const double tol = 1e-5 * scale[i] + 1e-30;
              if (!(std::fabs(got[i] - static_cast<double>(want[i])) <= tol)) {
                ADD_FAILURE() << "y[" << i << "] = " << got[i] << ", reference " << want[i]
                              << ", tolerance " << tol;
                ++bad;
              }
            }
            if (IsQuantized(type) && HasFusedMulAdd(target)) {
              EXPECT_TRUE(BitEqual(got, want)) << "integer path should match the reference exactly";
            }
          });
        }
      }
    }
  }
}

// Float weights take any column count: the leftover columns after the last full vector.
TEST(MatMulTest, FloatTypesAnyColumnCount) {
  ThreadPool pool(2);
  for (TensorType type : {TensorType::kF32, TensorType::kF16, TensorType::kBF16}) {
    for (int64_t cols : {1, 17, 100, 1001}) {
      SCOPED_TRACE(TypeName(type) + " cols " + std::to_string(cols));
      const int64_t rows = 19;
      const int64_t n = 6;
      const TestMatrix m = MakeMatrix(type, rows, cols, 31);
      const std::vector<float> x = RandomFloats(n * cols, 32);
      std::vector<float> want(static_cast<size_t>(n * rows));
      ref::MatMul(m.view, x.data(), n, want.data());
      const std::vector<double> scale = AbsProducts(m, x, n);
      ForEachSimdTarget([&](int64_t) {
        const std::vector<float> got = RunMatMul(m.view, x, n, pool);
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_NEAR(got[i], want[i], 1e-5 * scale[i] + 1e-30) << i;
        }
        for (int64_t t = 0; t < n; ++t) {
          const std::vector<float> xt(x.begin() + t * cols, x.begin() + (t + 1) * cols);
          const std::vector<float> yt = RunMatMul(m.view, xt, 1, pool);
          EXPECT_TRUE(std::equal(yt.begin(), yt.end(), got.begin() + t * rows)) << "token " << t;
        }
      });
    }
  }
}

TEST(MatMulTest, ThreadCountDoesNotChangeResults) {
  for (TensorType type : kAllTypes) {
    SCOPED_TRACE(TypeName(type));
    const TestMatrix m = MakeMatrix(type, 257, FitCols(type, 4096 + 32), 5);
    for (int64_t n : {1, 17}) {
      const std::vector<float> x = RandomFloats(n * m.view.cols, 6);
      ForEachSimdTarget([&](int64_t) {
        ThreadPool one(1);
        const std::vector<float> base = RunMatMul(m.view, x, n, one);
        for (int threads = 2; threads <= 4; ++threads) {
          ThreadPool pool(threads);
          EXPECT_TRUE(BitEqual(RunMatMul(m.view, x, n, pool), base)) << threads << " threads";
        }
      });
    }
  }
}

// A pipeline must produce the same tokens whether a prompt is run as one batch or token by token.
TEST(MatMulTest, BatchEqualsTokenByToken) {
  ThreadPool pool(2);
  for (TensorType type : kAllTypes) {
    for (int64_t cols : {FitCols(type, 96), FitCols(type, 4096 + 32)}) {
      for (int64_t rows : {67, 257}) {
        SCOPED_TRACE(TypeName(type) + " rows " + std::to_string(rows) + " cols " +
                     std::to_string(cols));
        const TestMatrix m = MakeMatrix(type, rows, cols, 9);
        const int64_t n = 35;  // two full token tiles and a partial one
        const std::vector<float> x = RandomFloats(n * cols, 10);
        ForEachSimdTarget([&](int64_t) {
          const std::vector<float> batch = RunMatMul(m.view, x, n, pool);
          std::vector<float> single(batch.size());
          for (int64_t t = 0; t < n; ++t) {
            const std::vector<float> xt(x.begin() + t * cols, x.begin() + (t + 1) * cols);
            const std::vector<float> yt = RunMatMul(m.view, xt, 1, pool);
            std::copy(yt.begin(), yt.end(), single.begin() + t * rows);
          }
          EXPECT_TRUE(BitEqual(batch, single));
          // And split into uneven batches: the small ones of continuous batching take the
          // decode path, the larger ones the panel path.
          constexpr int64_t kSplits[] = {5, 12, 8, 2, 7, 1};
          std::vector<float> split(batch.size());
          for (int64_t t0 = 0, i = 0; t0 < n; ++i) {
            const int64_t nt = std::min<int64_t>(kSplits[i % std::size(kSplits)], n - t0);
            const std::vector<float> xs(x.begin() + t0 * cols, x.begin() + (t0 + nt) * cols);
            const std::vector<float> ys = RunMatMul(m.view, xs, nt, pool);
            std::copy(ys.begin(), ys.end(), split.begin() + t0 * rows);
            t0 += nt;
          }
          EXPECT_TRUE(BitEqual(batch, split));
        });
      }
    }
  }
}

TEST(MatMulTest, PaddedRowStride) {
  ThreadPool pool(2);
  for (TensorType type : kAllTypes) {
    SCOPED_TRACE(TypeName(type));
    const int64_t cols = FitCols(type, 160);
    const TestMatrix packed = MakeMatrix(type, 37, cols, 13);
    const TestMatrix padded = MakeMatrix(type, 37, cols, 13, /*extra_row_bytes=*/64 + 6);
    const std::vector<float> x = RandomFloats(3 * cols, 14);
    EXPECT_TRUE(BitEqual(RunMatMul(packed.view, x, 3, pool), RunMatMul(padded.view, x, 3, pool)));
  }
}

// Against the exact product of the dequantized weights and the original activations: the only
// error of the integer paths is the Q8_0 rounding of the activations. Per value it is at most
// d/2 + 127 * |d - f16(d)| (d = amax / 127 of its block), so
//   |y - exact| <= sum_b (d_b/2 + 127 |d_b - f16(d_b)|) * sum_{i in b} |W[r, i]| + 1e-5 * sum
//   |w||x|.
TEST(MatMulTest, AccuracyAgainstExactProduct) {
  ThreadPool pool(2);
  for (TensorType type : kAllTypes) {
    if (type == TensorType::kF32 || type == TensorType::kBF16) continue;
    SCOPED_TRACE(TypeName(type));
    const int64_t rows = 67;
    const int64_t cols = FitCols(type, 4096 + 32);
    const int64_t n = 5;
    const TestMatrix m = MakeMatrix(type, rows, cols, 15);
    std::vector<float> x = RandomFloats(n * cols, 16);
    for (int64_t i = 0; i < n * cols; i += 97) x[i] *= 30.0f;  // outliers widen some blocks
    const std::vector<float> y = RunMatMul(m.view, x, n, pool);
    const std::vector<double> scale = AbsProducts(m, x, n);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double exact = 0.0;
        double bound = 1e-5 * scale[t * rows + r];
        for (int64_t b = 0; b < cols / 32; ++b) {
          float amax = 0.0f;
          double wsum = 0.0;
          for (int j = 0; j < 32; ++j) {
            const int64_t i = b * 32 + j;
            exact += static_cast<double>(m.dequantized[r * cols + i]) * x[t * cols + i];
            amax = std::max(amax, std::fabs(x[t * cols + i]));
            wsum += std::fabs(m.dequantized[r * cols + i]);
          }
          if (IsQuantized(type)) {
            const float d = amax / 127.0f;
            bound += (d / 2 + 127.0 * std::fabs(d - F16ToF32(F32ToF16(d)))) * wsum;
          }
        }
        EXPECT_NEAR(y[t * rows + r], exact, bound) << "t " << t << " r " << r;
      }
    }
  }
}

}  // namespace
}  // namespace kvasir
