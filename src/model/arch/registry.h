// The architecture registry: the only place that switches on `general.architecture`. Each
// architecture file maps its GGUF keys to a ModelConfig and names its tensors; everything else reads
// the config.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "model/model_config.h"

namespace kvasir {

struct ArchSpec {
  std::string_view name;  // general.architecture value
  // Fills `cfg` from the file's keys (prefix "<name>.") and tensor shapes.
  Status (*load_config)(const GgufFile& file, ModelConfig* cfg);
};

// The spec for the file's architecture, or an error naming it and the supported ones.
Result<ArchSpec> LookupArch(const GgufFile& file);
// Names of the architectures this build runs, for messages: "llama, qwen2, qwen3".
std::string SupportedArchList();

// Reads a ModelConfig from a GGUF file through the registry.
Result<ModelConfig> LoadModelConfig(const GgufFile& file);

// The layer of a tensor named "blk.N.rest" (N of at most 8 digits), or -1 for any other name.
int LayerOfTensorName(std::string_view name);

// An integer key that must be present and in [1, 2^30], else an error naming the file and key.
Result<int> GetPositiveInt(const GgufFile& file, const std::string& key);

// Shared loader for llama-family keys under `prefix` ("llama", "qwen2", ...): block_count,
// embedding_length, feed_forward_length, attention.head_count[_kv], attention.key_length,
// attention.layer_norm_rms_epsilon, context_length, rope.freq_base, rope.dimension_count,
// rope.scaling.*; n_vocab from the token embedding's shape; tied output when output.weight is absent.
// feed_forward_length may be absent only when expert_count is present (n_ff stays 0).
Status LoadLlamaFamilyConfig(const GgufFile& file, std::string_view prefix, ModelConfig* cfg);

}  // namespace kvasir
