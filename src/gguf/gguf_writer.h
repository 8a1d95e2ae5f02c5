// GGUF v3 writer. Produces files llama.cpp's gguf reader and the gguf Python package accept:
// header, kvs, tensor index, padding to `general.alignment` (default 32), aligned tensor data.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace kvasir {

class GgufWriter {
 public:
  // Metadata, in insertion order. Setting an existing key replaces its value in place.
  void SetKv(const std::string& key, GgufValue value);
  // Copies all kvs of a parsed header (e.g. to keep a tokenizer when slicing a model).
  void CopyKvs(const GgufHeader& header);

  // Adds a tensor. `ne` uses ggml order (ne[0] contiguous); `data` must be exactly the byte size of
  // that shape in `type`. The bytes are copied unless the span outlives Write() (set `borrow`).
  Status AddTensor(const std::string& name, TensorType type, std::span<const uint64_t> ne,
                   std::span<const uint8_t> data, bool borrow = false);

  // Writes the file to `path` (via a temporary file and rename, so no half-written file is left
  // under the final name). Errors name the path and the cause (e.g. disk full).
  Status Write(const std::string& path) const;
  // Serialises the header + tensor index (with padding) only, as Write() would lay it out.
  std::vector<uint8_t> SerializeHeader() const;

 private:
  struct Tensor {
    GgufTensorInfo info;
    std::vector<uint8_t> owned;
    std::span<const uint8_t> data;
  };
  uint32_t Alignment() const;
  std::vector<GgufKv> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace kvasir
