// llama: Llama 2/3, TinyLlama, SmolLM and other models exported with general.architecture = llama.
// Interleaved-pair RoPE, no biases, untied or tied output.
#include "model/arch/registry.h"

namespace kvasir {

Status LoadLlamaConfig(const GgufFile& file, ModelConfig* cfg) {
  KV_RETURN_IF_ERROR(LoadLlamaFamilyConfig(file, "llama", cfg));
  cfg->rope_type = RopeType::kNormal;
  return Status::Ok();
}

}  // namespace kvasir
