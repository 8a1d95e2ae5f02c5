// ModelConfig: everything shared code needs to know about an architecture, as data. Architecture
// files (arch/*.cpp) fill it from GGUF keys; nothing outside arch/ and registry.cpp looks at the
// architecture's name.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace kvasir {

enum class RopeType {
  kNormal,  // rotate interleaved pairs (x[2i], x[2i+1]) — llama
  kNeox,    // rotate (x[i], x[i + n_rot/2]) — qwen2, qwen3
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

  int q_dim() const { return n_head * head_dim; }
  int kv_dim() const { return n_head_kv * head_dim; }
};

// Tensor names for one layer, in the GGUF naming scheme of the architecture.
struct LayerTensorNames {
  std::string attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm;
  std::string ffn_norm, ffn_gate, ffn_up, ffn_down;
};

}  // namespace kvasir
