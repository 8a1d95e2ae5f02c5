// Q4_1, Q5_0, Q5_1 and the K-quants: dequantization of hand-made blocks against the layouts
// written out element by element (and against the values scripts/kquant_values.py computes from
// the formats' definitions), quantize -> dequantize error bounds, and the fast paths against the
// reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"
#include "kernels_test_util.h"

namespace kvasir {
namespace {

using testing::ForEachSimdTarget;
using testing::RandomFloats;

constexpr TensorType kNewTypes[] = {TensorType::kQ4_1, TensorType::kQ5_0, TensorType::kQ5_1,
                                    TensorType::kQ2_K, TensorType::kQ3_K, TensorType::kQ4_K,
                                    TensorType::kQ5_K, TensorType::kQ6_K};

std::string Name(TensorType t) { return TensorTypeName(static_cast<uint32_t>(t)); }

// One block of patterned bytes, f16 fields set to small exact values.
std::vector<uint8_t> PatternBlock(TensorType type) {
  std::vector<uint8_t> b(RowBytes(type, BlockValues(type)));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>((i * 37 + 11) & 0xFF);
  auto put16 = [&](size_t off, float v) {
    const uint16_t h = F32ToF16(v);
    std::memcpy(b.data() + off, &h, 2);
  };
  switch (type) {
    case TensorType::kQ4_1:
    case TensorType::kQ5_1:
      put16(0, 0.5f);
      put16(2, -1.25f);
      break;
    case TensorType::kQ5_0:
      put16(0, 0.25f);
      break;
    case TensorType::kQ2_K:
      put16(80, 0.5f);
      put16(82, 0.125f);
      break;
    case TensorType::kQ3_K:
      put16(108, 0.25f);
      break;
    case TensorType::kQ4_K:
    case TensorType::kQ5_K:
      put16(0, 0.5f);
      put16(2, 0.25f);
      break;
    case TensorType::kQ6_K:
      put16(208, 0.125f);
      break;
    default:
      break;
  }
  return b;
}

float F16At(const std::vector<uint8_t>& b, size_t off) {
  uint16_t h;
  std::memcpy(&h, b.data() + off, 2);
  return F16ToF32(h);
}
int Bit(const uint8_t* p, int i) { return (p[i / 8] >> (i % 8)) & 1; }

// The value of element v of the block, spelled out from the layout (ggml-common.h) in double.
double Expected(TensorType type, const std::vector<uint8_t>& b, int v) {
  const uint8_t* p = b.data();
  switch (type) {
    case TensorType::kQ4_1: {
      const int q = v < 16 ? p[4 + v] & 15 : p[4 + v - 16] >> 4;
      return double{F16At(b, 0)} * q + F16At(b, 2);
    }
    case TensorType::kQ5_0:
    case TensorType::kQ5_1: {
      const bool q51 = type == TensorType::kQ5_1;
      const uint8_t* qh = p + (q51 ? 4 : 2);
      const uint8_t* qs = qh + 4;
      const int q = (v < 16 ? qs[v] & 15 : qs[v - 16] >> 4) | Bit(qh, v) << 4;
      return q51 ? double{F16At(b, 0)} * q + F16At(b, 2) : double{F16At(b, 0)} * (q - 16);
    }
    case TensorType::kQ2_K: {
      const uint8_t* qs = p + 16;
      const int q = (qs[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3;
      const int sc = p[v / 16];
      return double{F16At(b, 80)} * (sc & 15) * q - double{F16At(b, 82)} * (sc >> 4);
    }
    case TensorType::kQ3_K: {
      const uint8_t* hmask = p;
      const uint8_t* qs = p + 32;
      const uint8_t* sc = p + 96;
      const int j = v / 16;
      const int low = j < 8 ? sc[j] & 15 : sc[j - 8] >> 4;
      const int s = (low | ((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
      const int q = ((qs[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3) -
                    (((hmask[v % 32] >> (v / 32)) & 1) ? 0 : 4);
      return double{F16At(b, 108)} * s * q;
    }
    case TensorType::kQ4_K:
    case TensorType::kQ5_K: {
      const uint8_t* sc = p + 4;
      const int j = v / 32;
      const int s = j < 4 ? sc[j] & 63 : (sc[j + 4] & 15) | (sc[j - 4] >> 6) << 4;
      const int m = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
      const bool q5 = type == TensorType::kQ5_K;
      const uint8_t* qs = p + (q5 ? 48 : 16);
      int q = (qs[32 * (v / 64) + v % 32] >> (4 * (j % 2))) & 15;
      if (q5) q |= ((p[16 + v % 32] >> j) & 1) << 4;
      return double{F16At(b, 0)} * s * q - double{F16At(b, 2)} * m;
    }
    case TensorType::kQ6_K: {
      const int n = v / 128, c = (v % 128) / 32, l = v % 32;
      const int lo = (p[64 * n + 32 * (c % 2) + l] >> (4 * (c / 2))) & 15;
      const int hi = (p[128 + 32 * n + l] >> (2 * c)) & 3;
      const auto s = static_cast<int8_t>(p[192 + v / 16]);
      return double{F16At(b, 208)} * s * ((lo | hi << 4) - 32);
    }
    default:
      return 0.0;
  }
}

TEST(KQuantTest, DequantizeHandMadeBlocks) {
  for (TensorType type : kNewTypes) {
    SCOPED_TRACE(Name(type));
    const std::vector<uint8_t> block = PatternBlock(type);
    const int64_t n = BlockValues(type);
    std::vector<float> want(n);
    ref::DequantizeRow(type, block.data(), n, want.data());
    for (int v = 0; v < n; ++v) {
      // The f32 operations round; every factor here is short enough that the products are exact
      // in f32 but the last, which rounds once (relative 2^-24).
      const double e = Expected(type, block, v);
      EXPECT_NEAR(want[v], e, std::fabs(e) * 1.2e-7) << "element " << v;
    }
    ForEachSimdTarget([&](int64_t) {
      std::vector<float> got(n);
      DequantizeRow(type, block.data(), n, got.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
    });
  }
}

// The values scripts/kquant_values.py computes from the block layouts alone (the pattern block
// above and two seeded blocks of each format, every value), which CI checks with the same script
// (kquant_values_check): an expected value the code under test did not produce. Compared as floats,
// so -0 and +0 are the same value (the sign of a zero follows the order of the multiplies).
TEST(KQuantTest, DequantizeGivesTheValuesOfTheFormatDefinitions) {
  const std::string path = std::string(KVASIR_SOURCE_DIR) + "/tests/kernels/kquant_values.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const nlohmann::json table = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(table.is_discarded()) << path << " is not JSON";
  std::set<std::string> types;
  for (const nlohmann::json& block : table["blocks"]) {
    const std::string name = block["type"];
    SCOPED_TRACE(name + " " + block["label"].get<std::string>());
    const std::optional<TensorType> type = TensorTypeFromName(name);
    ASSERT_TRUE(type.has_value()) << name;
    types.insert(name);
    const std::string hex = block["bytes"];
    std::vector<uint8_t> bytes(hex.size() / 2);
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    }
    const std::vector<float> want = block["values"].get<std::vector<float>>();
    const int64_t n = BlockValues(*type);
    ASSERT_EQ(bytes.size(), RowBytes(*type, n));
    ASSERT_EQ(static_cast<int64_t>(want.size()), n);
    std::vector<float> got(n);
    ref::DequantizeRow(*type, bytes.data(), n, got.data());
    for (int64_t v = 0; v < n; ++v) ASSERT_EQ(got[v], want[v]) << "element " << v;
    ForEachSimdTarget([&](int64_t) {
      std::vector<float> fast(n);
      DequantizeRow(*type, bytes.data(), n, fast.data());
      for (int64_t v = 0; v < n; ++v) ASSERT_EQ(fast[v], want[v]) << "element " << v;
    });
  }
  // Every block format the kernels read is in the table.
  EXPECT_EQ(types.size(), std::size(kNewTypes) + 2) << "q4_0, q8_0 and the types of kNewTypes";
  for (TensorType t : kNewTypes) EXPECT_TRUE(types.count(Name(t))) << Name(t);
}

// Relative RMS error of quantize -> dequantize on Gaussian data, at three magnitudes: the bound is
// 5% above what ggml's reference quantizers give on such data (q4_1 0.096, q5_0 0.068, q5_1 0.046,
// q2_k 0.358, q3_k 0.198, q4_k 0.090, q5_k 0.046, q6_k 0.026), and every value stays within a
// few steps of its input.
TEST(KQuantTest, RoundTripError) {
  struct Bound {
    TensorType type;
    double rel_rmse;
  };
  const Bound bounds[] = {{TensorType::kQ4_1, 0.102}, {TensorType::kQ5_0, 0.072},
                          {TensorType::kQ5_1, 0.049}, {TensorType::kQ2_K, 0.376},
                          {TensorType::kQ3_K, 0.208}, {TensorType::kQ4_K, 0.095},
                          {TensorType::kQ5_K, 0.049}, {TensorType::kQ6_K, 0.028}};
  const int64_t n = 256 * 32;
  for (const Bound& bound : bounds) {
    for (float scale : {1e-3f, 1.0f, 50.0f}) {
      SCOPED_TRACE(Name(bound.type) + " scale " + std::to_string(scale));
      const std::vector<float> x = RandomFloats(n, 41, scale);
      std::vector<uint8_t> bytes(RowBytes(bound.type, n));
      ref::QuantizeRow(bound.type, x.data(), n, bytes.data());
      std::vector<float> back(n);
      ref::DequantizeRow(bound.type, bytes.data(), n, back.data());
      double err = 0.0, norm = 0.0, worst = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        err += (back[i] - static_cast<double>(x[i])) * (back[i] - x[i]);
        norm += static_cast<double>(x[i]) * x[i];
        worst = std::max(worst, std::fabs(back[i] - static_cast<double>(x[i])));
      }
      EXPECT_LE(std::sqrt(err / norm), bound.rel_rmse);
      EXPECT_LE(worst, 3.0 * scale) << "largest error";
      // The fast quantizer writes the same bytes.
      std::vector<uint8_t> fast(bytes.size());
      QuantizeRow(bound.type, x.data(), n, fast.data());
      EXPECT_EQ(fast, bytes);
    }
  }
}

// All-zero input gives zero blocks that dequantize to zeros (no NaN from a zero scale).
TEST(KQuantTest, ZerosStayZero) {
  for (TensorType type : kNewTypes) {
    SCOPED_TRACE(Name(type));
    const int64_t n = BlockValues(type) * 2;
    const std::vector<float> x(n, 0.0f);
    std::vector<uint8_t> bytes(RowBytes(type, n));
    ref::QuantizeRow(type, x.data(), n, bytes.data());
    std::vector<float> back(n, 1.0f);
    DequantizeRow(type, bytes.data(), n, back.data());
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(back[i], 0.0f) << i;
  }
}

TEST(KQuantTest, RowBytes) {
  EXPECT_EQ(RowBytes(TensorType::kQ4_1, 64), 40u);
  EXPECT_EQ(RowBytes(TensorType::kQ5_0, 64), 44u);
  EXPECT_EQ(RowBytes(TensorType::kQ5_1, 64), 48u);
  EXPECT_EQ(RowBytes(TensorType::kQ2_K, 512), 168u);
  EXPECT_EQ(RowBytes(TensorType::kQ3_K, 512), 220u);
  EXPECT_EQ(RowBytes(TensorType::kQ4_K, 2048), 8u * 144u);
  EXPECT_EQ(RowBytes(TensorType::kQ5_K, 2048), 8u * 176u);
  EXPECT_EQ(RowBytes(TensorType::kQ6_K, 2048), 8u * 210u);
  EXPECT_EQ(BlockValues(TensorType::kQ6_K), 256);
  EXPECT_EQ(BlockValues(TensorType::kQ5_1), 32);
  EXPECT_EQ(BlockValues(TensorType::kIQ2_XXS), 0);
}

}  // namespace
}  // namespace kvasir
