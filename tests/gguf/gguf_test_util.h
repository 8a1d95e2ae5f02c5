// Helpers for the GGUF tests: a byte builder for hand-made (often broken) files and a sample
// writer with every value type and a few tensor types.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "base/check.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"

namespace kvasir::testing {

// Appends little-endian GGUF fields; nothing is validated, so any broken file can be made.
class GgufBytes {
 public:
  GgufBytes& U8(uint8_t v) { return Pod(v); }
  GgufBytes& U32(uint32_t v) { return Pod(v); }
  GgufBytes& U64(uint64_t v) { return Pod(v); }
  GgufBytes& Str(std::string_view s) {
    U64(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  // Magic, version, tensor count, kv count.
  GgufBytes& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return U32(kGgufMagic).U32(version).U64(n_tensors).U64(n_kv);
  }
  GgufBytes& KvU32(std::string_view key, uint32_t v) {
    return Str(key).U32(static_cast<uint32_t>(GgufType::kUint32)).U32(v);
  }
  GgufBytes& KvStr(std::string_view key, std::string_view v) {
    return Str(key).U32(static_cast<uint32_t>(GgufType::kString)).Str(v);
  }
  // Name, n_dims, ne[], type id, offset.
  GgufBytes& Tensor(std::string_view name, const std::vector<uint64_t>& ne, uint32_t type,
                    uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) U64(d);
    return U32(type).U64(offset);
  }
  GgufBytes& PadTo(size_t alignment) {
    while (bytes.size() % alignment != 0) bytes.push_back(0);
    return *this;
  }
  GgufBytes& Zeros(size_t n) {
    bytes.resize(bytes.size() + n, 0);
    return *this;
  }

  std::vector<uint8_t> bytes;

 private:
  template <typename T>
  GgufBytes& Pod(T v) {
    const size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
    return *this;
  }
};

// Parses a whole in-memory file named "test.gguf".
inline Result<GgufHeader> ParseBytes(const std::vector<uint8_t>& b) {
  return ParseGgufHeader(b, b.size(), "test.gguf");
}

// Deterministic bytes for tensor payloads.
inline std::vector<uint8_t> PatternBytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// One kv of every value type, strings with odd bytes, empty and nested arrays.
inline std::vector<GgufKv> SampleKvs() {
  static constexpr char kOddString[] = "nul\0byte \xe2\x96\x81utf8";
  std::vector<GgufValue> nested_u32 = {
      GgufValue::Array(GgufArray::Of(std::vector<uint32_t>{1, 2, 3})),
      GgufValue::Array(GgufArray::Of(std::vector<uint32_t>{})),
      GgufValue::Array(GgufArray::Of(std::vector<uint32_t>{4}))};
  std::vector<GgufValue> deep = {GgufValue::Array(GgufArray::Of(std::vector<GgufValue>{
      GgufValue::Array(GgufArray::Of(std::vector<std::string>{"a", "", "ccc"})),
      GgufValue::Array(GgufArray::Of(std::vector<double>{0.5, -2.25}))}))};
  return {
      {"general.architecture", GgufValue::String("llama")},
      {"t.u8", GgufValue::Uint8(200)},
      {"t.i8", GgufValue::Int8(-100)},
      {"t.u16", GgufValue::Uint16(60000)},
      {"t.i16", GgufValue::Int16(-30000)},
      {"t.u32", GgufValue::Uint32(4000000000u)},
      {"t.i32", GgufValue::Int32(-2000000000)},
      {"t.f32", GgufValue::Float32(1.5f)},
      {"t.bool", GgufValue::Bool(true)},
      {"t.string", GgufValue::String(std::string(kOddString, sizeof(kOddString) - 1))},
      {"t.empty_string", GgufValue::String("")},
      {"t.u64", GgufValue::Uint64(18000000000000000000ull)},
      {"t.i64", GgufValue::Int64(-9000000000000000000ll)},
      {"t.f64", GgufValue::Float64(-3.0e300)},
      {"a.u8", GgufValue::Array(GgufArray::Of(std::vector<uint8_t>{0, 1, 255}))},
      {"a.i8", GgufValue::Array(GgufArray::Of(std::vector<int8_t>{-128, 0, 127}))},
      {"a.u16", GgufValue::Array(GgufArray::Of(std::vector<uint16_t>{0, 65535}))},
      {"a.i16", GgufValue::Array(GgufArray::Of(std::vector<int16_t>{-32768, 32767}))},
      {"a.u32", GgufValue::Array(GgufArray::Of(std::vector<uint32_t>{7, 8, 9}))},
      {"a.i32", GgufValue::Array(GgufArray::Of(std::vector<int32_t>{-1, 0, 1}))},
      {"a.f32", GgufValue::Array(GgufArray::Of(std::vector<float>{0.f, -1000.f, 3.25f}))},
      {"a.bool", GgufValue::Array(GgufArray::Of(std::vector<bool>{true, false, true}))},
      {"a.string", GgufValue::Array(GgufArray::Of(std::vector<std::string>{"<unk>", "", "x"}))},
      {"a.u64", GgufValue::Array(GgufArray::Of(std::vector<uint64_t>{1ull << 63}))},
      {"a.i64", GgufValue::Array(GgufArray::Of(std::vector<int64_t>{-(1ll << 62)}))},
      {"a.f64", GgufValue::Array(GgufArray::Of(std::vector<double>{1e-300, 2.0}))},
      {"a.empty", GgufValue::Array(GgufArray::Of(std::vector<float>{}))},
      {"a.nested", GgufValue::Array(GgufArray::Of(std::move(nested_u32)))},
      {"a.deep", GgufValue::Array(GgufArray::Of(std::move(deep)))},
  };
}

struct SampleTensor {
  std::string name;
  TensorType type;
  std::vector<uint64_t> ne;
  std::vector<uint8_t> data;
};

// Tensors of several types and ranks; sizes chosen so that most need alignment padding.
inline std::vector<SampleTensor> SampleTensors() {
  std::vector<SampleTensor> ts = {
      {"f32.vec", TensorType::kF32, {5}, {}},        {"f16.mat", TensorType::kF16, {3, 7}, {}},
      {"q4_0.mat", TensorType::kQ4_0, {64, 3}, {}},  {"q8_0.3d", TensorType::kQ8_0, {32, 2, 2}, {}},
      {"q4_k.mat", TensorType::kQ4_K, {256, 2}, {}}, {"i32.4d", TensorType::kI32, {2, 1, 3, 2}, {}},
  };
  uint32_t seed = 1;
  for (SampleTensor& t : ts) {
    const TensorTypeInfo info = *GetTensorTypeInfo(static_cast<uint32_t>(t.type));
    uint64_t n = 1;
    for (uint64_t d : t.ne) n *= d;
    t.data = PatternBytes(n / info.block_elems * info.block_bytes, seed++);
  }
  return ts;
}

// A writer holding SampleKvs() and SampleTensors() (bytes copied).
inline GgufWriter SampleWriter() {
  GgufWriter w;
  for (GgufKv& kv : SampleKvs()) w.SetKv(kv.key, std::move(kv.value));
  for (const SampleTensor& t : SampleTensors()) {
    Status st = w.AddTensor(t.name, t.type, t.ne, t.data);
    KV_CHECK(st.ok(), "{}", st.message());
  }
  return w;
}

}  // namespace kvasir::testing
