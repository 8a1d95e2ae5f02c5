// libFuzzer target: ParseGgufHeader on arbitrary bytes, as a whole file and as a prefix of a file of
// unknown size. Whatever parses must satisfy the header's promises, and must serialise back
// (GgufWriter) into bytes that parse to the same header.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"

namespace {

using kvasir::GgufHeader;

void Require(bool cond) {
  if (!cond) std::abort();
}

// Serialises a parsed header (kvs + tensor index) with GgufWriter.
std::vector<uint8_t> Reserialize(const GgufHeader& h) {
  kvasir::GgufWriter w;
  w.CopyKvs(h);
  for (const kvasir::GgufTensorInfo& t : h.tensors) {
    Require(w.DeclareTensor(t.name, static_cast<kvasir::TensorType>(t.type),
                            std::span(t.ne).first(t.n_dims))
                .ok());
  }
  return w.SerializeHeader();
}

void CheckHeader(const GgufHeader& h, uint64_t file_size) {
  Require(h.alignment != 0 && (h.alignment & (h.alignment - 1)) == 0);
  Require(h.data_offset % h.alignment == 0 && h.data_offset >= h.header_bytes);
  for (const kvasir::GgufTensorInfo& t : h.tensors) {
    Require(t.n_dims <= 4 && t.offset % h.alignment == 0);
    if (file_size != 0) Require(h.data_offset + t.offset + t.n_bytes <= file_size);
  }
  // Parse -> write -> parse -> write is stable.
  const std::vector<uint8_t> once = Reserialize(h);
  uint64_t needed = 1;
  kvasir::Result<GgufHeader> again = kvasir::ParseGgufHeader(once, 0, "again", &needed);
  Require(again.ok() && needed == 0);
  Require(again->kvs.size() == h.kvs.size() && again->tensors.size() == h.tensors.size());
  Require(Reserialize(*again) == once);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  uint64_t needed = 0;
  kvasir::Result<GgufHeader> whole = kvasir::ParseGgufHeader(bytes, size, "fuzz.gguf", &needed);
  if (whole.ok()) CheckHeader(*whole, size);
  if (size > 0) Require(needed == 0);  // a whole file cannot grow

  kvasir::Result<GgufHeader> prefix = kvasir::ParseGgufHeader(bytes, 0, "fuzz.gguf", &needed);
  if (prefix.ok()) {
    Require(needed == 0);
    CheckHeader(*prefix, 0);
  } else if (needed != 0) {
    Require(needed > size);
  }
  return 0;
}
