// GGML tensor type ids as stored in GGUF files, with their block geometry. This is file-format
// knowledge only; the arithmetic on these types lives in src/kernels.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kvasir {

// Ids are frozen by the GGUF format.
enum class TensorType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
};

struct TensorTypeInfo {
  TensorType type;
  std::string_view name;  // "q4_0", as llama.cpp spells it
  uint32_t block_elems;   // elements per block (1 for plain types)
  uint32_t block_bytes;   // bytes per block
};

// Geometry of a known type id, or nullopt for an id this build does not know.
std::optional<TensorTypeInfo> GetTensorTypeInfo(uint32_t id);
// Name for messages: "q4_0", or "type 99" for unknown ids.
std::string TensorTypeName(uint32_t id);
// Looks a type up by its name ("q8_0", "F16", case-insensitive).
std::optional<TensorType> TensorTypeFromName(std::string_view name);

}  // namespace kvasir
