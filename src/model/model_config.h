// ModelConfig: everything shared code needs to know about an architecture, as data. Architecture
// files (arch/*.cpp) fill it from GGUF keys; nothing outside arch/ and registry.cpp looks at the
// architecture's name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "kernels/rope_angles.h"  // RopeType

namespace kvasir {

// What a layer's token mixer is.
enum class LayerKind : uint8_t {
  kAttention,  // softmax attention over a KV cache
  kDeltaNet,   // gated DeltaNet: short causal convolution + delta-rule recurrent state (qwen35)
};

// rope.scaling.type. Llama 3.1's "llama3" scaling is not a type: it is stored as rope_freqs.weight.
enum class RopeScaling {
  kNone,
  kLinear,  // positions divided by rope.scaling.factor
  kYarn,    // YaRN: per-pair blend of interpolated and extrapolated angles, plus a magnitude factor
};

struct ModelConfig {
  std::string arch;        // general.architecture, for display only
  std::string name;        // general.name, for display only
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;        // attention.key_length, else n_embd / n_head
  int n_ff = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  int n_rot = 0;           // rope.dimension_count, else head_dim
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / rope.scaling.factor (linear and YaRN scaling)
  RopeType rope_type = RopeType::kNormal;
  RopeScaling rope_scaling = RopeScaling::kNone;
  int rope_orig_ctx = 0;          // rope.scaling.original_context_length, else n_ctx_train
  float yarn_ext_factor = 0.0f;   // 0 unless YaRN: weight of the extrapolated angle
  float yarn_beta_fast = 32.0f;   // YaRN correction range, in rotations
  float yarn_beta_slow = 1.0f;
  float rope_attn_factor = 1.0f;  // magnitude factor of cos/sin (YaRN's mscale, rope.scaling.attn_factor)
  bool rope_freq_factors = false;  // rope_freqs.weight divides each pair's angle (Llama 3.1+)
  bool qkv_bias = false;   // q/k/v projections carry biases (qwen2)
  bool qk_norm = false;    // per-head RMSNorm of q and k before RoPE (qwen3)
  bool tied_output = false;  // no output.weight: the head reuses token_embd.weight
  // Attention options (Backend::Attention). No architecture here sets them yet; Gemma-style
  // models will (query scale, logit soft-capping, sliding-window layers).
  float attn_scale = 0.0f;    // multiplies q·k; 0 = 1 / sqrt(head_dim)
  float attn_softcap = 0.0f;  // > 0: scores become softcap * tanh(score / softcap)
  int attn_window = 0;        // > 0: a query sees only the last attn_window positions
  // IMROPE (qwen35): rope.dimension_sections. A rotated pair whose section is the fourth one takes
  // the fourth position component, which is 0 for text, so it is not rotated.
  bool rope_imrope = false;
  int rope_sections[4] = {0, 0, 0, 0};

  // Hybrid models (qwen35, qwen35moe). Empty means every layer is attention.
  std::vector<LayerKind> layer_kinds;  // [n_layer]
  bool attn_output_gate = false;  // attn_q rows hold [query | gate] per head; out *= sigmoid(gate)
  std::string ffn_norm_tensor = "ffn_norm";  // "post_attention_norm" for qwen35
  // Trailing multi-token-prediction blocks (not in the layer stack; a window with the head runs
  // the first one as a drafter, model/nextn_block.h).
  int n_layer_nextn = 0;
  // The nextn block reads the model's hidden state after the output norm (and chains its own
  // output after its shared_head_norm) rather than before those norms.
  bool nextn_normed_hidden = false;

  // Gated DeltaNet (ssm.*).
  int ssm_conv_kernel = 0;  // ssm.conv_kernel: taps of the causal depthwise convolution
  int ssm_state = 0;        // ssm.state_size: key and value head size
  int ssm_n_k_heads = 0;    // ssm.group_count
  int ssm_n_v_heads = 0;    // ssm.time_step_rank; value head h reads key head h % n_k_heads
  int ssm_inner = 0;        // ssm.inner_size = n_v_heads * state

  // Mixture of experts. n_expert == 0 means a dense SwiGLU FFN of n_ff.
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;         // expert_feed_forward_length
  int n_ff_shexp = 0;       // expert_shared_feed_forward_length; 0 = no shared expert

  int q_dim() const { return n_head * head_dim; }
  int kv_dim() const { return n_head_kv * head_dim; }
  LayerKind layer_kind(int il) const {
    return layer_kinds.empty() ? LayerKind::kAttention : layer_kinds[static_cast<size_t>(il)];
  }
  // DeltaNet channels through the convolution: q and k (n_k_heads * state each) and v (inner).
  int ssm_conv_dim() const { return 2 * ssm_n_k_heads * ssm_state + ssm_inner; }
  // f32 values of one sequence's recurrent state in a DeltaNet layer: conv window + delta state.
  int64_t ssm_state_floats() const {
    return static_cast<int64_t>(ssm_conv_kernel - 1) * ssm_conv_dim() +
           static_cast<int64_t>(ssm_n_v_heads) * ssm_state * ssm_state;
  }
};

}  // namespace kvasir
