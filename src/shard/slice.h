// Stage slices: a stage mini-GGUF holds one window of layers [first, last) of a parent model, with
// all of the parent's metadata (tokenizer included), so a stage can be served from a file that is a
// fraction of the model's size. Tensors keep their names; the slice also carries
//   kvasir.window.first / kvasir.window.last (u32): the window it holds,
//   kvasir.window.tied_output (bool): the parent has no output.weight (token_embd is the head),
//   kvasir.model_id (string): the parent's identity, so a slice and its parent agree in HELLO.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"

namespace kvasir {

struct SliceSummary {
  int n_tensors = 0;          // tensors written
  uint64_t bytes = 0;         // tensor bytes written
  uint64_t parent_bytes = 0;  // tensor bytes of the parent
};

// What a slice of a parent holds, before any tensor byte is read: its metadata and tensor index
// (`layout`, tensors declared in the order their bytes follow) and, for each of those tensors, its
// entry in the parent (name, type, shape, offset in the parent's data section, size).
struct SlicePlan {
  GgufWriter layout;
  std::vector<GgufTensorInfo> source;
  SliceSummary summary;
  std::string parent_model_id;  // 32 hex digits
};

// Plans the slice of `parent` holding layers [first, last) (see WriteSlice for which tensors it
// keeps). `parent` may be header-only (read over HTTP). Refuses an empty window, one outside the
// model or outside the parent's own slice.
Result<SlicePlan> PlanSlice(const GgufFile& parent, int first, int last);

// Writes the slice of `parent` holding layers [first, last) to `out_path`: blk.first .. blk.last-1,
// token_embd.weight when first == 0, output_norm.weight and the head (output.weight, or
// token_embd.weight when the embeddings are tied) when last == n_layer. Other non-layer tensors go
// to every slice. Tensor bytes are streamed from the parent's mapping; the file appears under
// `out_path` only when complete (temporary file and rename). `parent` may itself be a slice as
// long as it holds the window. Refuses an empty window, one outside the model or the parent's
// slice, and writing over the parent, naming the file and the constraint. `summary` may be null.
Status WriteSlice(const GgufFile& parent, int first, int last, const std::string& out_path,
                  SliceSummary* summary);

}  // namespace kvasir
