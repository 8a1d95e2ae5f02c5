// GGUF reader (v2 and v3). Parsing validates every count, length, offset and size against the
// bytes available before using it, so a truncated or hostile file yields an error naming the file,
// the field and the offset, never a crash, a hang or a giant allocation.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "gguf/gguf_value.h"
#include "gguf/tensor_type.h"

namespace kvasir {

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
inline constexpr uint32_t kGgufDefaultAlignment = 32;
// general.alignment must be a power of two no larger than this (real files use 32; a larger value
// would only pad files and headers to absurd sizes).
inline constexpr uint32_t kGgufMaxAlignment = uint32_t{1} << 20;

struct GgufTensorInfo {
  std::string name;
  // ne[0] is the contiguous (innermost) dimension, as in ggml. Unused dims are 1.
  std::array<uint64_t, 4> ne = {1, 1, 1, 1};
  uint32_t n_dims = 0;
  uint32_t type = 0;        // TensorType id (parsing refuses ids this build does not know)
  uint64_t offset = 0;      // relative to the start of the tensor data section
  uint64_t n_bytes = 0;     // computed from type and shape
  uint64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  // Rows of ne[0] elements: ne[1]*ne[2]*ne[3].
  uint64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
};

struct GgufKv {
  std::string key;
  GgufValue value;
};

// Parsed header + tensor index. Holds no tensor bytes.
struct GgufHeader {
  uint32_t version = 3;
  std::vector<GgufKv> kvs;               // in file order
  std::vector<GgufTensorInfo> tensors;   // in file order
  uint32_t alignment = kGgufDefaultAlignment;
  uint64_t data_offset = 0;              // absolute offset of the tensor data section
  uint64_t header_bytes = 0;             // bytes consumed by header+kv+tensor index (before padding)

  const GgufValue* Find(std::string_view key) const;
  const GgufTensorInfo* FindTensor(std::string_view name) const;
};

// Parses a header from a prefix of a GGUF file. `file_size` is the full file's size when known
// (tensor extents are checked against it), or 0 to skip that check (e.g. a partial download).
// If `bytes` ends before the header does, returns an error and sets *needed_bytes (when non-null)
// to a larger prefix size worth retrying with; otherwise *needed_bytes is set to 0.
// `name` is used in messages ("model.gguf: kv 3 (general.name): string length 99999 past end").
Result<GgufHeader> ParseGgufHeader(std::span<const uint8_t> bytes, uint64_t file_size,
                                   const std::string& name, uint64_t* needed_bytes = nullptr);

// A GGUF file on disk: its header plus a read-only mapping of the file. Tensor bytes are only
// touched when TensorData() spans are read.
class GgufFile {
 public:
  static Result<GgufFile> Open(const std::string& path);
  // A header without the file's bytes (e.g. read over HTTP): metadata, tensor index and the typed
  // lookups work; TensorData() must not be called. `name` (a URL, say) stands in for the path.
  static GgufFile HeaderOnly(GgufHeader header, std::string name, uint64_t file_size);

  const std::string& path() const { return header_only_ ? name_ : map_.path(); }
  bool header_only() const { return header_only_; }
  const GgufHeader& header() const { return header_; }
  uint32_t version() const { return header_.version; }
  const std::vector<GgufKv>& kvs() const { return header_.kvs; }
  const std::vector<GgufTensorInfo>& tensors() const { return header_.tensors; }
  uint64_t file_size() const { return header_only_ ? size_ : map_.size(); }
  const MappedFile& mapping() const { return map_; }

  const GgufValue* Find(std::string_view key) const { return header_.Find(key); }
  const GgufTensorInfo* FindTensor(std::string_view name) const { return header_.FindTensor(name); }

  // Typed lookups: error names the file and key when the key is missing or of the wrong type.
  Result<uint64_t> GetUint(std::string_view key) const;
  Result<double> GetFloat(std::string_view key) const;
  Result<std::string> GetString(std::string_view key) const;
  Result<bool> GetBool(std::string_view key) const;
  const GgufArray* GetArray(std::string_view key) const;  // nullptr if absent or not an array
  // Defaults when absent; error when present with a wrong type.
  Result<uint64_t> GetUintOr(std::string_view key, uint64_t fallback) const;
  Result<double> GetFloatOr(std::string_view key, double fallback) const;

  // The bytes of a tensor (already validated to lie inside the file).
  std::span<const uint8_t> TensorData(const GgufTensorInfo& t) const;

 private:
  MappedFile map_;
  GgufHeader header_;
  bool header_only_ = false;
  std::string name_;   // header_only_: stands in for the path
  uint64_t size_ = 0;  // header_only_: the whole file's size
};

}  // namespace kvasir
