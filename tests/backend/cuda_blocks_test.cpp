// The CUDA backend's weight layouts and block decoders, on the host: the same functions the
// kernels run (backend/cuda/cuda_blocks.h is compiled by nvcc for the device and by the host
// compiler here), checked against the CPU kernels' integer form (kernels/quant_ints.h) for every
// block of every type the backend multiplies. This checks the index arithmetic of the repacking
// and the decoding; the kernels themselves run only where a device is (backend_ops_test).
#include "backend/cuda/cuda_blocks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cuda/cuda_weights.h"
#include "kernels/kernels_ref.h"
#include "kernels/kernels_test_util.h"
#include "kernels/quant_ints.h"

namespace kvasir::cuda {
namespace {

using kvasir::testing::MakeMatrix;
using kvasir::testing::TestMatrix;

// Decodes block b of row r with the decoder the kernels instantiate for `type`.
void Decode(TensorType type, const DevMatrix& m, const uint8_t* image, int64_t r, int64_t b,
            QBlock* out) {
  switch (type) {
    case TensorType::kQ4_0:
      return DecodeBlock<kWQ4_0>(m, image, r, b, out);
    case TensorType::kQ4_1:
      return DecodeBlock<kWQ4_1>(m, image, r, b, out);
    case TensorType::kQ5_0:
      return DecodeBlock<kWQ5_0>(m, image, r, b, out);
    case TensorType::kQ5_1:
      return DecodeBlock<kWQ5_1>(m, image, r, b, out);
    case TensorType::kQ8_0:
      return DecodeBlock<kWQ8_0>(m, image, r, b, out);
    case TensorType::kQ4_K:
      return DecodeBlock<kWQ4_K>(m, image, r, b, out);
    case TensorType::kQ5_K:
      return DecodeBlock<kWQ5_K>(m, image, r, b, out);
    case TensorType::kQ6_K:
      return DecodeBlock<kWQ6_K>(m, image, r, b, out);
    default:
      FAIL() << "not a quantized type of the CUDA backend";
  }
}

struct Repacked {
  TestMatrix src;
  DevMatrix dev;
  std::vector<uint8_t> image;
};

// A [rows, cols] matrix of `type` whose file rows carry 6 extra bytes (a row stride the device
// layout must not copy), repacked as UploadMatrix does.
Repacked MakeRepacked(TensorType type, int64_t rows, int64_t cols, uint32_t seed) {
  Repacked r{MakeMatrix(type, rows, cols, seed, 6), {}, {}};
  const DeviceLayout l = LayoutOf(type, rows, cols);
  r.image.assign(static_cast<size_t>(l.bytes), 0xAB);
  Repack(r.src.view, l, r.image.data());
  r.dev.data = r.image.data();
  r.dev.type = static_cast<int>(type);
  r.dev.rows = rows, r.dev.cols = cols;
  r.dev.row_bytes = l.row_bytes, r.dev.heads = l.heads, r.dev.stride = l.bytes;
  return r;
}

constexpr TensorType kQuantTypes[] = {TensorType::kQ8_0, TensorType::kQ4_0, TensorType::kQ4_1,
                                      TensorType::kQ5_0, TensorType::kQ5_1, TensorType::kQ4_K,
                                      TensorType::kQ5_K, TensorType::kQ6_K};

TEST(CudaBlocksTest, EveryBlockDecodesToTheCpuIntegerForm) {
  for (TensorType type : kQuantTypes) {
    SCOPED_TRACE(TensorTypeName(static_cast<uint32_t>(type)));
    const int64_t rows = 7, cols = 3 * BlockValues(type);
    const Repacked m = MakeRepacked(type, rows, cols, 41);
    for (int64_t r = 0; r < rows; ++r) {
      const auto* row = static_cast<const uint8_t*>(m.src.view.data) + r * m.src.view.row_bytes;
      for (int64_t b = 0; b < cols / 32; ++b) {
        kernels_internal::IntBlock want;
        kernels_internal::DecodeIntBlock(type, row, b, &want);
        QBlock got;
        Decode(type, m.dev, m.image.data(), r, b, &got);
        for (int i = 0; i < 32; ++i) {
          ASSERT_EQ(QValue(got, i), want.q[i]) << "row " << r << " block " << b << " value " << i;
        }
        EXPECT_EQ(got.s[0], want.s[0]);
        EXPECT_EQ(got.s[1], want.s[1]);
        EXPECT_EQ(std::memcmp(&got.dw, &want.dw, 4), 0) << got.dw << " " << want.dw;
        EXPECT_EQ(std::memcmp(&got.dmin, &want.dmin, 4), 0) << got.dmin << " " << want.dmin;
      }
    }
  }
}

TEST(CudaBlocksTest, BlockDotIsTheExactIntegerDotOfTheCpuForm) {
  std::mt19937 rng(7);
  for (TensorType type : kQuantTypes) {
    SCOPED_TRACE(TensorTypeName(static_cast<uint32_t>(type)));
    const Repacked m = MakeRepacked(type, 3, BlockValues(type), 43);
    for (int64_t b = 0; b < BlockValues(type) / 32; ++b) {
      int8_t x[32];
      for (int8_t& v : x) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
      uint32_t packed[8];
      std::memcpy(packed, x, 32);
      QBlock got;
      Decode(type, m.dev, m.image.data(), 2, b, &got);
      kernels_internal::IntBlock want;
      kernels_internal::DecodeIntBlock(
          type, static_cast<const uint8_t*>(m.src.view.data) + 2 * m.src.view.row_bytes, b, &want);
      int32_t dot[2] = {0, 0};
      for (int i = 0; i < 32; ++i) dot[i / 16] += int32_t{want.q[i]} * x[i];
      EXPECT_EQ(BlockDot(got, packed), want.s[0] * dot[0] + want.s[1] * dot[1]) << "block " << b;
    }
  }
}

TEST(CudaBlocksTest, DequantizedValuesAreTheCpuRowsBitForBit) {
  for (TensorType type : kQuantTypes) {
    SCOPED_TRACE(TensorTypeName(static_cast<uint32_t>(type)));
    const int64_t rows = 5, cols = 2 * BlockValues(type);
    const Repacked m = MakeRepacked(type, rows, cols, 47);
    std::vector<float> want(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      ref::DequantizeRow(type,
                         static_cast<const uint8_t*>(m.src.view.data) + r * m.src.view.row_bytes,
                         cols, want.data());
      for (int64_t b = 0; b < cols / 32; ++b) {
        QBlock blk;
        Decode(type, m.dev, m.image.data(), r, b, &blk);
        for (int i = 0; i < 32; ++i) {
          const float got = BlockValue(blk, i);
          ASSERT_EQ(std::memcmp(&got, &want[b * 32 + i], 4), 0)
              << "row " << r << " value " << b * 32 + i << ": " << got << " against "
              << want[b * 32 + i];
        }
      }
    }
  }
}

TEST(CudaBlocksTest, FloatRowsArePaddedWithZerosToAlignedLengths) {
  for (TensorType type : {TensorType::kF32, TensorType::kF16, TensorType::kBF16}) {
    SCOPED_TRACE(TensorTypeName(static_cast<uint32_t>(type)));
    const int64_t rows = 3, cols = 83;
    const Repacked m = MakeRepacked(type, rows, cols, 53);
    const size_t elem = type == TensorType::kF32 ? 4 : 2;
    EXPECT_EQ(m.dev.row_bytes % 16, 0);
    EXPECT_GT(m.dev.row_bytes, static_cast<int64_t>(cols * elem));
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* got = m.image.data() + r * m.dev.row_bytes;
      const auto* want = static_cast<const uint8_t*>(m.src.view.data) + r * m.src.view.row_bytes;
      EXPECT_EQ(std::memcmp(got, want, cols * elem), 0) << "row " << r;
      for (int64_t i = cols * static_cast<int64_t>(elem); i < m.dev.row_bytes; ++i) {
        ASSERT_EQ(got[i], 0) << "row " << r << " byte " << i;
      }
    }
  }
}

TEST(CudaBlocksTest, LayoutsAlignEveryMatrixAndEveryScaleArray) {
  for (TensorType type : CudaTypes()) {
    SCOPED_TRACE(TensorTypeName(static_cast<uint32_t>(type)));
    const int64_t rows = 67, cols = 3 * BlockValues(type) * (BlockValues(type) == 1 ? 29 : 1);
    const DeviceLayout l = LayoutOf(type, rows, cols);
    EXPECT_EQ(l.bytes % 256, 0);
    EXPECT_GE(l.bytes, rows * l.row_bytes);
    if (IsSplitType(static_cast<int>(type))) {
      EXPECT_EQ(l.heads % 256, 0);
      EXPECT_GE(l.heads, rows * l.row_bytes);
      EXPECT_GE(l.bytes, l.heads + rows * (cols / 32) * HeadBytes(static_cast<int>(type)));
    } else {
      EXPECT_EQ(l.heads, 0);
    }
  }
  EXPECT_FALSE(CudaSupportsType(TensorType::kQ2_K));
  EXPECT_FALSE(CudaSupportsType(TensorType::kQ3_K));
}

TEST(CudaBlocksTest, HalfAndBf16AreTheKernelsConversionsForEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = HalfToFloat(static_cast<uint16_t>(h)),
                want = F16ToF32(static_cast<uint16_t>(h));
    const float got_bf = Bf16ToFloat(h), want_bf = BF16ToF32(static_cast<uint16_t>(h));
    if (!std::isnan(want_bf)) {
      ASSERT_EQ(got_bf, want_bf) << "bf16 bits " << h;
    }
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << "f16 bits " << h;  // payloads may differ
      continue;
    }
    uint32_t gb, wb;
    std::memcpy(&gb, &got, 4);
    std::memcpy(&wb, &want, 4);
    ASSERT_EQ(gb, wb) << "f16 bits " << h;
  }
}

}  // namespace
}  // namespace kvasir::cuda
