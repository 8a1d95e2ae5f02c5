// qwen3: llama layout with per-head RMSNorm of q and k before RoPE, NEOX-style RoPE, and a head
// size (attention.key_length) that need not equal n_embd / n_head.
#include "model/arch/registry.h"

namespace kvasir {

Status LoadQwen3Config(const GgufFile& file, ModelConfig* cfg) {
  KV_RETURN_IF_ERROR(LoadLlamaFamilyConfig(file, "qwen3", cfg));
  cfg->rope_type = RopeType::kNeox;
  cfg->qk_norm = true;
  return Status::Ok();
}

}  // namespace kvasir
