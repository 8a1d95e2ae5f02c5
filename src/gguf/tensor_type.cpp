#include "gguf/tensor_type.h"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <string>

namespace kvasir {
namespace {

// Block geometry as defined by the GGUF/ggml format (QK_K = 256 for the K-quants).
constexpr std::array kTypes = {
    TensorTypeInfo{TensorType::kF32, "f32", 1, 4},
    TensorTypeInfo{TensorType::kF16, "f16", 1, 2},
    TensorTypeInfo{TensorType::kQ4_0, "q4_0", 32, 18},
    TensorTypeInfo{TensorType::kQ4_1, "q4_1", 32, 20},
    TensorTypeInfo{TensorType::kQ5_0, "q5_0", 32, 22},
    TensorTypeInfo{TensorType::kQ5_1, "q5_1", 32, 24},
    TensorTypeInfo{TensorType::kQ8_0, "q8_0", 32, 34},
    TensorTypeInfo{TensorType::kQ8_1, "q8_1", 32, 36},
    TensorTypeInfo{TensorType::kQ2_K, "q2_k", 256, 84},
    TensorTypeInfo{TensorType::kQ3_K, "q3_k", 256, 110},
    TensorTypeInfo{TensorType::kQ4_K, "q4_k", 256, 144},
    TensorTypeInfo{TensorType::kQ5_K, "q5_k", 256, 176},
    TensorTypeInfo{TensorType::kQ6_K, "q6_k", 256, 210},
    TensorTypeInfo{TensorType::kQ8_K, "q8_k", 256, 292},
    TensorTypeInfo{TensorType::kIQ2_XXS, "iq2_xxs", 256, 66},
    TensorTypeInfo{TensorType::kIQ2_XS, "iq2_xs", 256, 74},
    TensorTypeInfo{TensorType::kIQ3_XXS, "iq3_xxs", 256, 98},
    TensorTypeInfo{TensorType::kIQ1_S, "iq1_s", 256, 50},
    TensorTypeInfo{TensorType::kIQ4_NL, "iq4_nl", 32, 18},
    TensorTypeInfo{TensorType::kIQ3_S, "iq3_s", 256, 110},
    TensorTypeInfo{TensorType::kIQ2_S, "iq2_s", 256, 82},
    TensorTypeInfo{TensorType::kIQ4_XS, "iq4_xs", 256, 136},
    TensorTypeInfo{TensorType::kI8, "i8", 1, 1},
    TensorTypeInfo{TensorType::kI16, "i16", 1, 2},
    TensorTypeInfo{TensorType::kI32, "i32", 1, 4},
    TensorTypeInfo{TensorType::kI64, "i64", 1, 8},
    TensorTypeInfo{TensorType::kF64, "f64", 1, 8},
    TensorTypeInfo{TensorType::kIQ1_M, "iq1_m", 256, 56},
    TensorTypeInfo{TensorType::kBF16, "bf16", 1, 2},
    TensorTypeInfo{TensorType::kTQ1_0, "tq1_0", 256, 54},
    TensorTypeInfo{TensorType::kTQ2_0, "tq2_0", 256, 66},
};

}  // namespace

std::optional<TensorTypeInfo> GetTensorTypeInfo(uint32_t id) {
  for (const auto& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

std::string TensorTypeName(uint32_t id) {
  auto info = GetTensorTypeInfo(id);
  return info ? std::string(info->name) : fmt::format("type {}", id);
}

std::optional<TensorType> TensorTypeFromName(std::string_view name) {
  std::string lower;
  for (char c : name) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  for (const auto& t : kTypes) {
    if (t.name == lower) return t.type;
  }
  return std::nullopt;
}

}  // namespace kvasir
