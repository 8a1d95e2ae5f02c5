// GGUF metadata values: every scalar type, strings, and (nested) arrays.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace kvasir {

// Value type ids are frozen by the GGUF format.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

const char* GgufTypeName(GgufType t);

struct GgufValue;
// An array holds elements of one type. Scalar arrays are stored unboxed for speed
// (a 150k-entry vocabulary's scores are one std::vector<float>).
struct GgufArray {
  GgufType elem_type = GgufType::kUint8;
  std::variant<std::vector<uint8_t>, std::vector<int8_t>, std::vector<uint16_t>,
               std::vector<int16_t>, std::vector<uint32_t>, std::vector<int32_t>,
               std::vector<float>, std::vector<bool>, std::vector<std::string>,
               std::vector<GgufValue>, std::vector<uint64_t>, std::vector<int64_t>,
               std::vector<double>>
      items;
  size_t size() const;
};

struct GgufValue {
  GgufType type = GgufType::kUint8;
  std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string,
               GgufArray, uint64_t, int64_t, double>
      value;

  // Any integer type (signed or unsigned, any width) that fits in the target, else nullopt.
  std::optional<int64_t> AsInt() const;
  std::optional<uint64_t> AsUint() const;
  // float32/float64 (and integers) as double.
  std::optional<double> AsDouble() const;
  std::optional<bool> AsBool() const;
  const std::string* AsString() const;
  const GgufArray* AsArray() const;
  // Short human-readable rendering: strings quoted, arrays as "[f32 x 32000]" plus a few items.
  std::string ToDisplayString(size_t max_items = 4) const;

  static GgufValue Uint32(uint32_t v) { return {GgufType::kUint32, v}; }
  static GgufValue Int32(int32_t v) { return {GgufType::kInt32, v}; }
  static GgufValue Uint64(uint64_t v) { return {GgufType::kUint64, v}; }
  static GgufValue Float32(float v) { return {GgufType::kFloat32, v}; }
  static GgufValue Bool(bool v) { return {GgufType::kBool, v}; }
  static GgufValue String(std::string v) { return {GgufType::kString, std::move(v)}; }
  static GgufValue Array(GgufArray a) { return {GgufType::kArray, std::move(a)}; }
};

}  // namespace kvasir
