// qwen2: llama layout with q/k/v projection biases and NEOX-style RoPE.
#include "model/arch/registry.h"

namespace kvasir {

Status LoadQwen2Config(const GgufFile& file, ModelConfig* cfg) {
  KV_RETURN_IF_ERROR(LoadLlamaFamilyConfig(file, "qwen2", cfg));
  cfg->rope_type = RopeType::kNeox;
  cfg->qkv_bias = true;
  return Status::Ok();
}

}  // namespace kvasir
