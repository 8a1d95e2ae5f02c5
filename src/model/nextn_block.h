// The multi-token-prediction (nextn) block of Qwen3.5 / DeepSeek-style checkpoints, run as a
// drafter next to the window that holds the output head. Row i of a run pairs the model's hidden
// state h at position p = pos0 + i with the embedding e of the token at p + 1:
//   x = eh_proj([enorm(e); hnorm(h)])          // [n, 2 * n_embd] -> [n, n_embd]
//   x = one transformer block (gated attention over the block's own cache at positions p, FFN)
//   logits = output(shared_head_norm(x))       // the model's own head: the token at p + 2
// and its output x (after shared_head_norm when cfg.nextn_normed_hidden) is the hidden input of
// the next chained draft. Internal to src/model: LayerWindow owns it and forwards its calls.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "model/layer_window.h"
#include "model/model_config.h"
#include "model/tensor_binder.h"
#include "model/window_layers.h"

namespace kvasir {

struct NextnWeights {
  LayerWeights layer;                      // the block's attention and FFN (blk.{n_layer}.*)
  const DeviceMatrix* eh_proj = nullptr;   // [n_embd, 2 * n_embd]: [embedding | hidden] -> n_embd
  DevPtr enorm;                            // [n_embd] RMSNorm of the token embedding
  DevPtr hnorm;                            // [n_embd] RMSNorm of the hidden state
  DevPtr head_norm;                        // [n_embd] shared_head_norm, before the model's head
  const DeviceMatrix* tok_embd = nullptr;  // [n_vocab, n_embd] the model's embeddings
  const DeviceMatrix* output = nullptr;    // [n_vocab, n_embd] the model's head
};

class NextnBlock {
 public:
  // Binds the first nextn block (blk.{cfg.n_layer}.*) through `b`. tok_embd and output are the
  // window's matrices when it has them (token_embd is bound here when tok_embd is null).
  // `rope` must outlive the block. Refuses missing or misshapen tensors and a backend without
  // the ops, naming them.
  static Result<std::unique_ptr<NextnBlock>> Bind(TensorBinder& b, const ModelConfig& cfg,
                                                  const DeviceMatrix* tok_embd,
                                                  const DeviceMatrix* output,
                                                  const RopeAngleParams& rope, int n_ctx,
                                                  Backend& be);

  NextnBlock(const ModelConfig& cfg, const RopeAngleParams& rope, int n_ctx, Backend& be);

  // The block's per-sequence caches, which follow the window's sequences.
  void Open(int seq_id) { seqs_[seq_id] = Sequence(); }
  void Close(int seq_id) { seqs_.erase(seq_id); }
  void Rename(int from, int to);
  int Length(int seq_id) const;
  Status Truncate(int seq_id, int n_keep);
  Status Forward(const NextnInput& in, NextnOutput* out);

 private:
  struct Sequence {
    int length = 0;
    LayerState attn;  // the block's KV cache
  };
  Status Validate(const NextnInput& in) const;

  ModelConfig cfg_;  // the model's, with the block's layer index marked as attention
  const RopeAngleParams& rope_;
  int n_ctx_;
  Backend& be_;
  NextnWeights w_;
  std::unordered_map<int, Sequence> seqs_;

  // Scratch, grown as needed: [n, n_embd] unless marked.
  Scratch ids_;      // [n] int32
  Scratch emb_;      // token embeddings
  Scratch hid_;      // hidden rows in
  Scratch cat_;      // [n, 2 * n_embd] normed [embedding | hidden]
  Scratch x_;        // the block's residual stream
  Scratch normed_;   // shared_head_norm(x)
  Scratch cos_sin_;  // [n, n_rot / 2, 2]
  Scratch logits_;   // [1 or n, n_vocab]
  std::vector<int32_t> positions_;
  LayerScratch scratch_;
};

}  // namespace kvasir
