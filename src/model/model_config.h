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
  float rope_freq_scale = 1.0f;  // 1 / rope.scaling.factor for linear scaling
  RopeType rope_type = RopeType::kNormal;
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
