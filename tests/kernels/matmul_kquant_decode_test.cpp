// The one-token (decode) paths of the K-quant kernels, which read each row's super-blocks in row
// order and add sixteen (AVX-512) or eight (AVX2) rows' partial sums together, against the
// reference bit for bit: row counts around the group sizes, one to eight tokens (one token takes
// the row-order path, two to eight the transposed one), and the largest weights and activations
// the formats allow, which bound the kernels' int16 and int32 sums.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"
#include "kernels_test_util.h"

namespace kvasir {
namespace {

using testing::ForEachSimdTarget;
using testing::MakeMatrix;
using testing::RandomFloats;
using testing::TestMatrix;

constexpr TensorType kKTypes[] = {TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K};

std::string Trace(TensorType type, int64_t rows, int64_t cols, int64_t n) {
  return TensorTypeName(static_cast<uint32_t>(type)) + " rows " + std::to_string(rows) + " cols " +
         std::to_string(cols) + " tokens " + std::to_string(n);
}

// Targets whose MulAdd is fused like std::fma in the reference (the x86 ones take the kernels
// under test: AVX3_DL the VNNI ones, AVX3 and AVX2 the AVX2 ones).
bool HasFusedMulAdd(int64_t target) {
  const std::string name = kernels_internal::SimdTargetNameOf(target);
  return name != "SSE4" && name != "SSSE3" && name != "EMU128" && name != "SCALAR";
}

// MatMul on every fused SIMD target equals ref::MatMul bit for bit.
void ExpectExact(const MatrixView& w, const std::vector<float>& x, int64_t n, ThreadPool& pool) {
  std::vector<float> want(static_cast<size_t>(n * w.rows));
  ref::MatMul(w, x.data(), n, want.data());
  int fused = 0;
  ForEachSimdTarget([&](int64_t target) {
    if (!HasFusedMulAdd(target)) return;
    ++fused;
    std::vector<float> got(want.size(), -1.0f);
    MatMul(w, x.data(), n, got.data(), pool);
    int bad = 0;
    for (size_t i = 0; i < got.size() && bad < 3; ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
        ADD_FAILURE() << "y[" << i << "] = " << got[i] << ", reference " << want[i];
        ++bad;
      }
    }
  });
  EXPECT_GT(fused, 0) << "no SIMD target with fused multiply-add on this CPU";
}

TEST(KQuantDecodeTest, FewTokensMatchReferenceAroundGroupSizes) {
  ThreadPool pool(2);
  uint32_t seed = 100;
  for (TensorType type : kKTypes) {
    for (int64_t cols : {256, 2304}) {
      for (int64_t rows : {1, 8, 9, 15, 16, 17, 31, 33, 48}) {
        for (int64_t n = 1; n <= 8; ++n) {
          if (n > 2 && rows != 33) continue;  // the transposed path has its own tests
          SCOPED_TRACE(Trace(type, rows, cols, n));
          const TestMatrix m = MakeMatrix(type, rows, cols, ++seed);
          ExpectExact(m.view, RandomFloats(n * cols, ++seed), n, pool);
        }
      }
    }
  }
}

// Every quantized weight at its largest value (Q4_K 15, Q5_K 31, Q6_K 63) and every activation
// at +-127 after quantization, the signs alternating by block: the largest sums any block makes.
TEST(KQuantDecodeTest, LargestValuesStayExact) {
  ThreadPool pool(2);
  for (TensorType type : kKTypes) {
    const int64_t rows = 19;
    const int64_t cols = 512;
    TestMatrix m = MakeMatrix(type, rows, cols, 7);
    const size_t block_bytes = RowBytes(type, kSuperBlock);
    // Byte ranges of the quantized values within a block (quant_blocks.h).
    size_t begin = 0, end = 0;
    switch (type) {
      case TensorType::kQ4_K:
        begin = 16, end = 144;
        break;
      case TensorType::kQ5_K:
        begin = 16, end = 176;
        break;
      default:
        begin = 0, end = 192;
        break;
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t sb = 0; sb < cols / kSuperBlock; ++sb) {
        uint8_t* blk = m.bytes.data() + r * m.view.row_bytes + sb * block_bytes;
        std::memset(blk + begin, 0xFF, end - begin);
      }
    }
    for (int64_t n : {1, 3}) {
      SCOPED_TRACE(Trace(type, rows, cols, n));
      std::vector<float> x(static_cast<size_t>(n * cols));
      for (size_t i = 0; i < x.size(); ++i) x[i] = (i / 32) % 2 == 0 ? 1.0f : -1.0f;
      ExpectExact(m.view, x, n, pool);
    }
  }
}

}  // namespace
}  // namespace kvasir
