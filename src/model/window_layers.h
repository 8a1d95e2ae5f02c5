// The layer bodies a LayerWindow runs: weights of one layer, the per-sequence state a layer keeps,
// and one function per block (attention, gated DeltaNet, dense FFN, mixture of experts). Internal
// to src/model; LayerWindow owns the buffers and calls these in layer order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "kernels/kernels.h"
#include "model/backend.h"
#include "model/model_config.h"
#include "model/tensor_binder.h"

namespace kvasir {

struct AttentionWeights {
  MatrixView wq;                 // [q_dim (x2 with attn_output_gate), n_embd]
  MatrixView wk, wv;             // [kv_dim, n_embd]
  MatrixView wo;                 // [n_embd, q_dim]
  const float* bq = nullptr;     // [q_dim] (qkv_bias)
  const float* bk = nullptr;     // [kv_dim]
  const float* bv = nullptr;     // [kv_dim]
  const float* q_norm = nullptr; // [head_dim] (qk_norm)
  const float* k_norm = nullptr; // [head_dim]
};

struct DeltaNetWeights {
  MatrixView qkv;                 // [conv_dim, n_embd]: q | k | v before the convolution
  MatrixView z;                   // [inner, n_embd]: the output gate (attn_gate)
  MatrixView beta, alpha;         // [n_v_heads, n_embd]
  MatrixView out;                 // [n_embd, inner]
  const float* conv = nullptr;    // [conv_dim, conv_kernel] taps, last = current token
  const float* dt_bias = nullptr; // [n_v_heads]
  const float* a = nullptr;       // [n_v_heads] = -exp(A_log)
  const float* norm = nullptr;    // [state] RMSNorm of each head's output
};

struct FfnWeights {
  MatrixView gate, up;  // [n_ff, n_embd]
  MatrixView down;      // [n_embd, n_ff]
};

struct MoeWeights {
  MatrixView router;                        // [n_expert, n_embd]
  std::vector<MatrixView> gate, up;         // n_expert x [n_ff_exp, n_embd]
  std::vector<MatrixView> down;             // n_expert x [n_embd, n_ff_exp]
  bool has_shared = false;
  MatrixView shared_gate;                   // [1, n_embd]: sigmoid scale of the shared expert
  FfnWeights shared;                        // n_ff = n_ff_shexp
};

struct LayerWeights {
  LayerKind kind = LayerKind::kAttention;
  const float* attn_norm = nullptr;  // [n_embd]
  const float* ffn_norm = nullptr;   // [n_embd]
  AttentionWeights attn;
  DeltaNetWeights delta;
  FfnWeights ffn;                    // when cfg.n_expert == 0
  MoeWeights moe;                    // when cfg.n_expert > 0
};

// Grows a scratch buffer to at least n values (never shrinks it).
inline void GrowScratch(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// Binds layer `il`'s tensors for its kind.
Status BindLayer(TensorBinder& b, const ModelConfig& cfg, int il, LayerWeights* w);

// What one layer keeps for one sequence.
struct LayerState {
  std::vector<float> k, v;  // attention: [length, kv_dim] each
  std::vector<float> conv;  // DeltaNet: [conv_kernel - 1, conv_dim] last inputs, oldest first
  std::vector<float> ssm;   // DeltaNet: [n_v_heads, state, state]
};

// A new sequence's state for a layer of `kind` (zeros for DeltaNet).
LayerState NewLayerState(const ModelConfig& cfg, LayerKind kind);

// One chunk of the batch resolved to its state: rows [row0, row0 + n) at positions pos0...
struct ChunkState {
  LayerState* state = nullptr;  // this layer's state of the chunk's sequence
  int row0 = 0;
  int n = 0;
  int pos0 = 0;
};

// Scratch buffers, grown as needed and reused across calls.
struct LayerScratch {
  std::vector<float> cur, q_full, q, k, v, gate, attn, proj;
  std::vector<float> qkv, conv, z, alpha, beta, dn_out;
  std::vector<float> ffn_gate, ffn_up, ffn_sum;
  std::vector<float> router, expert_in, expert_gate, expert_up, expert_out, shared_scale;
  std::vector<float> route_weight;  // [n_rows, n_expert_used]
  std::vector<int> route_expert;    // [n_rows, n_expert_used]
  std::vector<int> route_slot;      // [n_rows * n_expert_used]: row-slots grouped by expert
  std::vector<int> route_pos;       // [n_rows * n_expert_used]: each row-slot's place in that order
  std::vector<int> route_ids;       // [n_expert]: expert ids, sorted per row by probability
  std::vector<int> route_start;     // [n_expert + 1]: first grouped row-slot of each expert
  std::vector<int> route_fill;      // [n_expert]: next free grouped row-slot of each expert
};

// x: [n_rows, n_embd] residual stream, updated in place. cos_sin: [n_rows, n_rot / 2, 2].
void RunAttention(const ModelConfig& cfg, const LayerWeights& w, int n_ctx,
                  std::span<ChunkState> chunks, int n_rows, const float* cos_sin, float* x,
                  Backend& be, LayerScratch& s);
void RunDeltaNet(const ModelConfig& cfg, const LayerWeights& w, std::span<ChunkState> chunks,
                 int n_rows, float* x, Backend& be, LayerScratch& s);
// A dense SwiGLU FFN: out [n_rows, n_embd] = down(silu(gate(in)) * up(in)).
void RunDenseFfn(const FfnWeights& w, int n_ff, const float* in, int n_rows, float* out,
                 Backend& be, LayerScratch& s);
// Routed experts plus the gated shared expert: in, out [n_rows, n_embd] (moe_ffn.cpp).
void RunMoe(const ModelConfig& cfg, const MoeWeights& w, const float* in, int n_rows, float* out,
            Backend& be, LayerScratch& s);
// The FFN half of a layer (dense or experts), residual included.
void RunFfn(const ModelConfig& cfg, const LayerWeights& w, int n_rows, float* x, Backend& be,
            LayerScratch& s);

}  // namespace kvasir
