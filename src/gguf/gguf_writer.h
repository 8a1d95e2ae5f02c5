// GGUF v3 writer. Produces files llama.cpp's gguf reader and the gguf Python package accept:
// header, kvs, tensor index, padding to `general.alignment` (default 32), aligned tensor data.
#pragma once

#include <cstdint>
#include <memory>
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

  // Adds a tensor. `ne` uses ggml order (ne[0] contiguous), at most 4 dims (none: one element);
  // `data` must be exactly the byte size of that shape in `type`. The bytes are copied unless the
  // span outlives Write() (set `borrow`).
  Status AddTensor(const std::string& name, TensorType type, std::span<const uint64_t> ne,
                   std::span<const uint8_t> data, bool borrow = false);

  // Declares a tensor whose bytes are not held here: they are streamed later, in index order, by
  // GgufStreamWriter (for files too large to hold in memory). Same checks as AddTensor. Write()
  // refuses a writer with declared-only tensors.
  Status DeclareTensor(const std::string& name, TensorType type, std::span<const uint64_t> ne);
  // The tensor index in order, with offsets relative to the data section as SerializeHeader()
  // lays them out.
  std::vector<GgufTensorInfo> TensorInfos() const;

  // Writes the file to `path` (via a temporary file and rename, so no half-written file is left
  // under the final name). Errors name the path and the cause (e.g. disk full).
  Status Write(const std::string& path) const;
  // Serialises the header + tensor index (with padding) only, as Write() would lay it out.
  // general.alignment, when set, must be a power of two up to kGgufMaxAlignment (Write() reports
  // it otherwise).
  std::vector<uint8_t> SerializeHeader() const;

 private:
  struct Tensor {
    GgufTensorInfo info;
    std::vector<uint8_t> owned;
    std::span<const uint8_t> data;  // borrowed bytes; empty when the bytes are in `owned`
    bool declared_only = false;     // bytes come later through GgufStreamWriter
  };
  friend class GgufStreamWriter;
  uint32_t Alignment() const;
  std::vector<GgufKv> kvs_;
  std::vector<Tensor> tensors_;
};

// Writes a GGUF file whose tensor bytes arrive in pieces: the header and tensor index of `layout`
// first, then the bytes of every tensor in index order through Append() (pieces may be of any size
// and may cross tensor boundaries; alignment padding is inserted automatically). The file appears
// under `path` only when Finish() succeeds (temporary file and rename); a writer destroyed before
// that removes its temporary file. Not thread-safe.
class GgufStreamWriter {
 public:
  // Writes the header. Bytes held by `layout` for AddTensor tensors are ignored: all tensor bytes
  // come through Append(). Errors name the path.
  static Result<std::unique_ptr<GgufStreamWriter>> Create(const GgufWriter& layout,
                                                          const std::string& path);
  ~GgufStreamWriter();
  GgufStreamWriter(const GgufStreamWriter&) = delete;
  GgufStreamWriter& operator=(const GgufStreamWriter&) = delete;

  // Appends tensor bytes. Error when they run past the last tensor.
  Status Append(std::span<const uint8_t> bytes);
  // Index of the tensor the next appended byte belongs to (== tensor count when all are complete).
  size_t current_tensor() const;
  // Checks that every tensor got all its bytes, syncs, and renames the file into place.
  Status Finish();

 private:
  struct State;
  explicit GgufStreamWriter(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kvasir
