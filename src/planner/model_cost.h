// ModelCost: what the planner needs to know about a model, in bytes: the weights of each layer, the
// embedding and the head, the KV cache per token, and the boundary a stage sends per token. Pure
// data; computed once from a GGUF header (tensor bytes are never read).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace kvasir {

// Per process, on top of weights and KV: runtime, activations, buffers.
inline constexpr uint64_t kStageOverheadBytes = uint64_t{64} << 20;

struct ModelCost {
  int n_layer = 0;
  std::vector<uint64_t> layer_bytes;                    // [n_layer] sum of blk.N.* tensor bytes
  std::vector<std::vector<std::string>> layer_tensors;  // [n_layer] blk.N.* names, file order
  uint64_t embed_bytes = 0;                             // token_embd
  std::vector<std::string> embed_tensors;
  // output_norm + output, or output_norm + token_embd when the output is tied to the embedding.
  uint64_t head_bytes = 0;
  std::vector<std::string> head_tensors;
  bool tied_output = false;
  // Tensors outside layers, embedding and head (e.g. rope_freqs): every stage holds them.
  uint64_t shared_bytes = 0;
  std::vector<std::string> shared_tensors;
  uint64_t kv_bytes_per_token_layer = 0;  // 2 * n_head_kv * head_dim * 4 (f32 K and V)
  uint64_t boundary_bytes_per_token = 0;  // n_embd * 4 + 48 (f32 hidden state + frame header)
  // Per-layer detail of hybrid and mixture-of-experts models; each may be empty, meaning every
  // layer is a plain attention layer (layer_bytes read per token, kv_bytes_per_token_layer, no
  // fixed state).
  std::vector<uint64_t> layer_read_bytes;          // [n_layer] per token: experts count
                                                   // expert_used_count / expert_count of their bytes
  std::vector<uint64_t> layer_kv_bytes_per_token;  // [n_layer] 0 for a recurrent (DeltaNet) layer
  std::vector<uint64_t> layer_state_bytes;         // [n_layer] a sequence's fixed recurrent state
  // Multi-token-prediction blocks (blk.N for N >= n_layer): no layer of the stack; the stage with
  // the head holds them (and the embeddings) to draft with, counted in its WindowWeightBytes.
  uint64_t skipped_bytes = 0;
  std::vector<std::string> skipped_tensors;

  // Bytes a stage holding [first, last) keeps in memory (embedding when first == 0, head when last
  // == n_layer; a tied embedding is held once).
  uint64_t WindowWeightBytes(int first, int last) const;
  // Bytes a stage reads per decoded token: its layers, plus the head matrix on the last stage (the
  // embedding lookup reads one row, which is negligible).
  uint64_t WindowReadBytes(int first, int last) const;
  // One sequence's cache of `ctx` tokens: KV of the attention layers, the fixed recurrent state of
  // the others.
  uint64_t WindowKvBytes(int first, int last, int ctx) const;
  // All weights of the model, each tensor once.
  uint64_t TotalWeightBytes() const { return WindowWeightBytes(0, n_layer); }
  // Tensor names of a window, in the order layers, embedding, head, shared.
  std::vector<std::string> WindowTensors(int first, int last) const;
};

// Computes the cost of the model in `file`. Errors name the file (no layers, unknown arch, a layer
// index past block_count).
Result<ModelCost> ComputeModelCost(const GgufFile &file);

}  // namespace kvasir
