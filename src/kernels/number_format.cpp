// Scalar number-format conversions (exact IEEE half and bfloat16) and row geometry of the types
// the kernels support.
#include <cstring>
#include <string>

#include "base/check.h"
#include "kernels/kernels.h"

namespace kvasir {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    // Subnormal half: shift the leading one up to the implicit position.
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3FFu;
    return BitsFloat(sign | static_cast<uint32_t>(112 - e) << 23 | mant << 13);
  }
  if (exp == 31) return BitsFloat(sign | 0x7F800000u | mant << 13);  // inf, NaN keeps payload
  return BitsFloat(sign | (exp + 112) << 23 | mant << 13);
}

uint16_t F32ToF16(float f) {
  const uint32_t bits = FloatBits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) {
    // NaN: quiet it and keep the top of the payload, as the F16C instruction does.
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (abs < 0x38800000u) {
    // Result is a half subnormal or zero; 2^-25 and below (the tie included) round to zero.
    if (abs <= 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24
    uint32_t result = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t result = (abs >> 13) - (112u << 10);
  const uint32_t rem = abs & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;  // may carry into the exponent
  return static_cast<uint16_t>(sign | result);
}

float BF16ToF32(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

uint16_t F32ToBF16(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

bool KernelsSupport(TensorType type) { return BlockValues(type) > 0; }

std::string SupportedTypesList() {
  return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k";
}

int64_t BlockValues(TensorType type) {
  switch (type) {
    case TensorType::kF32:
    case TensorType::kF16:
    case TensorType::kBF16:
      return 1;
    case TensorType::kQ8_0:
    case TensorType::kQ4_0:
    case TensorType::kQ4_1:
    case TensorType::kQ5_0:
    case TensorType::kQ5_1:
      return 32;
    case TensorType::kQ2_K:
    case TensorType::kQ3_K:
    case TensorType::kQ4_K:
    case TensorType::kQ5_K:
    case TensorType::kQ6_K:
      return kSuperBlock;
    default:
      return 0;
  }
}

namespace {

size_t BlockBytes(TensorType type) {
  switch (type) {
    case TensorType::kF32:
      return 4;
    case TensorType::kF16:
    case TensorType::kBF16:
      return 2;
    case TensorType::kQ8_0:
      return sizeof(BlockQ8_0);
    case TensorType::kQ4_0:
      return sizeof(BlockQ4_0);
    case TensorType::kQ4_1:
      return sizeof(BlockQ4_1);
    case TensorType::kQ5_0:
      return sizeof(BlockQ5_0);
    case TensorType::kQ5_1:
      return sizeof(BlockQ5_1);
    case TensorType::kQ2_K:
      return sizeof(BlockQ2_K);
    case TensorType::kQ3_K:
      return sizeof(BlockQ3_K);
    case TensorType::kQ4_K:
      return sizeof(BlockQ4_K);
    case TensorType::kQ5_K:
      return sizeof(BlockQ5_K);
    case TensorType::kQ6_K:
      return sizeof(BlockQ6_K);
    default:
      return 0;
  }
}

}  // namespace

size_t RowBytes(TensorType type, int64_t n) {
  KV_CHECK(n >= 0, "negative row length {}", n);
  const int64_t values = BlockValues(type);
  KV_CHECK(values > 0, "RowBytes: unsupported type {}", static_cast<uint32_t>(type));
  KV_CHECK(n % values == 0, "{} row of {} values is not a multiple of {}",
           TensorTypeName(static_cast<uint32_t>(type)), n, values);
  return static_cast<size_t>(n / values) * BlockBytes(type);
}

}  // namespace kvasir
