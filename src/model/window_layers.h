// The layer bodies a LayerWindow runs: weights of one layer, the per-sequence state a layer keeps,
// and one function per block (attention, gated DeltaNet, dense FFN, mixture of experts). Every
// tensor lives in the window's backend and every computation is one of its ops; these functions
// only decide which op runs on which rows. Internal to src/model; LayerWindow owns the buffers and
// calls these in layer order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "model/model_config.h"
#include "model/tensor_binder.h"

namespace kvasir {

struct AttentionWeights {
  const DeviceMatrix* wq = nullptr;  // [q_dim (x2 with attn_output_gate), n_embd]
  const DeviceMatrix* wk = nullptr;  // [kv_dim, n_embd]
  const DeviceMatrix* wv = nullptr;  // [kv_dim, n_embd]
  const DeviceMatrix* wo = nullptr;  // [n_embd, q_dim]
  DevPtr bq, bk, bv;                 // [q_dim], [kv_dim], [kv_dim] (qkv_bias)
  DevPtr q_norm, k_norm;             // [head_dim] (qk_norm)
};

struct DeltaNetWeights {
  const DeviceMatrix* qkv = nullptr;    // [conv_dim, n_embd]: q | k | v before the convolution
  const DeviceMatrix* z = nullptr;      // [inner, n_embd]: the output gate (attn_gate)
  const DeviceMatrix* beta = nullptr;   // [n_v_heads, n_embd]
  const DeviceMatrix* alpha = nullptr;  // [n_v_heads, n_embd]
  const DeviceMatrix* out = nullptr;    // [n_embd, inner]
  DevPtr conv;                          // [conv_dim, conv_kernel] taps, last = current token
  DevPtr dt_bias;                       // [n_v_heads]
  DevPtr a;                             // [n_v_heads] = -exp(A_log)
  DevPtr norm;                          // [state] RMSNorm of each head's output
};

struct FfnWeights {
  const DeviceMatrix* gate = nullptr;  // [n_ff, n_embd]
  const DeviceMatrix* up = nullptr;    // [n_ff, n_embd]
  const DeviceMatrix* down = nullptr;  // [n_embd, n_ff]
};

struct MoeWeights {
  const DeviceMatrix* router = nullptr;  // [n_expert, n_embd]
  const DeviceMatrix* gate = nullptr;    // n_expert x [n_ff_exp, n_embd]
  const DeviceMatrix* up = nullptr;      // n_expert x [n_ff_exp, n_embd]
  const DeviceMatrix* down = nullptr;    // n_expert x [n_embd, n_ff_exp]
  bool has_shared = false;
  const DeviceMatrix* shared_gate = nullptr;  // [1, n_embd]: sigmoid scale of the shared expert
  FfnWeights shared;                          // n_ff = n_ff_shexp
};

struct LayerWeights {
  LayerKind kind = LayerKind::kAttention;
  DevPtr attn_norm;  // [n_embd]
  DevPtr ffn_norm;   // [n_embd]
  AttentionWeights attn;
  DeltaNetWeights delta;
  FfnWeights ffn;  // when cfg.n_expert == 0
  MoeWeights moe;  // when cfg.n_expert > 0
};

// Binds (and uploads) layer `il`'s tensors for its kind.
Status BindLayer(TensorBinder& b, const ModelConfig& cfg, int il, LayerWeights* w);

// The ops a layer of this kind needs under `cfg`, for the check at load.
std::vector<Op> LayerOps(const ModelConfig& cfg, LayerKind kind);
// The attention options of `cfg`: its scale (1 / sqrt(head_dim) unless set), soft-cap, window.
AttentionParams AttentionOptions(const ModelConfig& cfg);

// What one layer keeps for one sequence, in the backend.
struct LayerState {
  std::unique_ptr<DeviceBuffer> k, v;  // attention: [capacity, kv_dim] each (null until used)
  int capacity = 0;                    // positions k and v hold
  std::unique_ptr<DeviceBuffer> conv;  // DeltaNet: [conv_kernel - 1, conv_dim], oldest first
  std::unique_ptr<DeviceBuffer> ssm;   // DeltaNet: [n_v_heads, state, state]
  // DeltaNet checkpoints: the conv and ssm states at earlier lengths, slot (length % slots), so a
  // sequence can be rolled back within them. Empty until a chunk asks for checkpoints.
  std::vector<std::unique_ptr<DeviceBuffer>> saved_conv;  // slots x [conv_kernel - 1, conv_dim]
  std::vector<std::unique_ptr<DeviceBuffer>> saved_ssm;   // slots x [n_v_heads, state, state]
};

// A new sequence's state for a layer of `kind`: DeltaNet state allocated and zeroed; an attention
// cache is allocated when the first rows arrive (GrowKv).
Status NewLayerState(const ModelConfig& cfg, LayerKind kind, Backend& be, LayerState* s);
// Zeroes a DeltaNet layer's state (a sequence cleared).
void ClearLayerState(const ModelConfig& cfg, Backend& be, LayerState* s);
// Gives a DeltaNet layer `slots` checkpoint slots (kept when it has them already).
Status ReserveSavedStates(Backend& be, int slots, LayerState* s);
// Copies a DeltaNet layer's state into checkpoint slot `slot`, or back from it.
void SaveLayerState(Backend& be, int slot, LayerState* s);
void RestoreLayerState(Backend& be, int slot, LayerState* s);
// Makes an attention layer's cache hold at least `need` positions, keeping its first `length`:
// grown geometrically up to n_ctx, so a long generation does not copy at every step.
Status GrowKv(const ModelConfig& cfg, int n_ctx, int need, int length, Backend& be, LayerState* s);

// One chunk of the batch resolved to its state: rows [row0, row0 + n) at positions pos0...
struct ChunkState {
  LayerState* state = nullptr;  // this layer's state of the chunk's sequence
  int row0 = 0;
  int n = 0;
  int pos0 = 0;
  // DeltaNet: save the state before each of the chunk's last n_save rows, the state before the
  // row at position p into slot p % state->saved_conv.size() (those rows then run one by one).
  int n_save = 0;
};

// A buffer in the backend that grows (never shrinks) and does not keep its contents when it grows.
class Scratch {
 public:
  Status Reserve(Backend& be, int64_t n, std::string_view what);
  DevPtr operator+(int64_t n) const { return DevPtr{buf_.get(), 0} + n; }
  operator DevPtr() const { return DevPtr{buf_.get(), 0}; }  // NOLINT: reads like a pointer
  void Release() { buf_.reset(); }

 private:
  std::unique_ptr<DeviceBuffer> buf_;
};

// The layers' scratch buffers, reserved for a batch before its layers run.
struct LayerScratch {
  Scratch cur, q_full, q, k, v, gate, attn, proj;          // attention
  Scratch qkv, conv, z, alpha, beta, dn_out;               // DeltaNet
  Scratch ffn_gate, ffn_up, ffn_sum;                       // dense FFN, shared expert
  Scratch router, route_ids, route_weights, shared_scale;  // experts

  // Room for n_rows rows in every buffer the window's layers use.
  Status Reserve(Backend& be, const ModelConfig& cfg, bool has_attention, bool has_delta_net,
                 int n_rows);
  // Gives every buffer back to the backend.
  void Release();
};

// x: [n_rows, n_embd] residual stream, updated in place. cos_sin: [n_rows, n_rot / 2, 2].
void RunAttention(const ModelConfig& cfg, const LayerWeights& w, std::span<ChunkState> chunks,
                  int n_rows, DevPtr cos_sin, DevPtr x, Backend& be, LayerScratch& s);
void RunDeltaNet(const ModelConfig& cfg, const LayerWeights& w, std::span<ChunkState> chunks,
                 int n_rows, DevPtr x, Backend& be, LayerScratch& s);
// A dense SwiGLU FFN: out [n_rows, n_embd] = down(silu(gate(in)) * up(in)).
void RunDenseFfn(const FfnWeights& w, int n_ff, DevPtr in, int n_rows, DevPtr out, Backend& be,
                 LayerScratch& s);
// Routed experts plus the gated shared expert: in, out [n_rows, n_embd] (moe_ffn.cpp).
void RunMoe(const ModelConfig& cfg, const MoeWeights& w, DevPtr in, int n_rows, DevPtr out,
            Backend& be, LayerScratch& s);
// The FFN half of a layer (dense or experts), residual included.
void RunFfn(const ModelConfig& cfg, const LayerWeights& w, int n_rows, DevPtr x, Backend& be,
            LayerScratch& s);

}  // namespace kvasir
