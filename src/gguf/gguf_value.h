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

  // An array whose element type follows from T (std::vector<float> -> kFloat32,
  // std::vector<GgufValue> -> kArray for an array of arrays).
  template <typename T>
  static GgufArray Of(std::vector<T> items);
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
  static GgufValue Uint8(uint8_t v) { return {GgufType::kUint8, v}; }
  static GgufValue Int8(int8_t v) { return {GgufType::kInt8, v}; }
  static GgufValue Uint16(uint16_t v) { return {GgufType::kUint16, v}; }
  static GgufValue Int16(int16_t v) { return {GgufType::kInt16, v}; }
  static GgufValue Int64(int64_t v) { return {GgufType::kInt64, v}; }
  static GgufValue Float64(double v) { return {GgufType::kFloat64, v}; }
};

// Defined here, where GgufValue is complete.
template <typename T>
GgufArray GgufArray::Of(std::vector<T> items) {
  GgufArray a;
  a.items = std::move(items);
  a.elem_type = static_cast<GgufType>(a.items.index());  // alternatives follow the type ids
  return a;
}

// Same type and same value, recursively for arrays. Floats compare by value (NaN != NaN).
bool operator==(const GgufArray& a, const GgufArray& b);
bool operator==(const GgufValue& a, const GgufValue& b);

}  // namespace kvasir
