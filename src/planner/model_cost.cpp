#include "planner/model_cost.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/arch/registry.h"

namespace kvasir {
namespace {

constexpr const char *kEmbedName = "token_embd.weight";

}  // namespace

uint64_t ModelCost::WindowWeightBytes(int first, int last) const {
  uint64_t bytes = shared_bytes;
  for (int l = first; l < last; ++l) bytes += layer_bytes[l];
  bool has_embed = first == 0, has_head = last == n_layer;
  if (has_embed) bytes += embed_bytes;
  if (has_head) {
    bytes += head_bytes - (tied_output && has_embed ? embed_bytes : 0);
    // The multi-token-prediction blocks are held next to the head, with the embeddings they read.
    bytes += skipped_bytes;
    if (skipped_bytes > 0 && !has_embed && !tied_output) bytes += embed_bytes;
  }
  return bytes;
}

uint64_t ModelCost::WindowReadBytes(int first, int last) const {
  uint64_t bytes = 0;
  for (int l = first; l < last; ++l) {
    bytes += layer_read_bytes.empty() ? layer_bytes[l] : layer_read_bytes[l];
  }
  if (last == n_layer) bytes += head_bytes;
  return bytes;
}

uint64_t ModelCost::WindowKvBytes(int first, int last, int ctx) const {
  uint64_t bytes = 0;
  for (int l = first; l < last; ++l) {
    const uint64_t per_token =
        layer_kv_bytes_per_token.empty() ? kv_bytes_per_token_layer : layer_kv_bytes_per_token[l];
    bytes += uint64_t(ctx) * per_token + (layer_state_bytes.empty() ? 0 : layer_state_bytes[l]);
  }
  return bytes;
}

std::vector<std::string> ModelCost::WindowTensors(int first, int last) const {
  std::vector<std::string> names;
  for (int l = first; l < last; ++l) {
    names.insert(names.end(), layer_tensors[l].begin(), layer_tensors[l].end());
  }
  if (first == 0) names.insert(names.end(), embed_tensors.begin(), embed_tensors.end());
  if (last == n_layer) {
    for (const auto &n : head_tensors) {
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
  }
  names.insert(names.end(), shared_tensors.begin(), shared_tensors.end());
  return names;
}

Result<ModelCost> ComputeModelCost(const GgufFile &file) {
  KV_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(file));
  if (cfg.n_layer <= 0) return Error("{}: the model has no layers", file.path());
  ModelCost cost;
  cost.n_layer = cfg.n_layer;
  cost.layer_bytes.assign(cfg.n_layer, 0);
  cost.layer_tensors.assign(cfg.n_layer, {});
  cost.tied_output = cfg.tied_output;
  cost.layer_read_bytes.assign(cfg.n_layer, 0);
  for (const auto &t : file.tensors()) {
    int layer = LayerOfTensorName(t.name);
    if (layer >= cfg.n_layer + cfg.n_layer_nextn) {
      return Error("{}: tensor {}: layer {} past block_count {}", file.path(), t.name, layer,
                   cfg.n_layer + cfg.n_layer_nextn);
    }
    if (layer >= cfg.n_layer) {
      cost.skipped_bytes += t.n_bytes;
      cost.skipped_tensors.push_back(t.name);
    } else if (layer >= 0) {
      cost.layer_bytes[layer] += t.n_bytes;
      cost.layer_tensors[layer].push_back(t.name);
      // A token reads only its routed experts' rows of the stacked expert tensors.
      const bool experts = cfg.n_expert > 0 && t.name.find("_exps.") != std::string::npos;
      cost.layer_read_bytes[layer] +=
          experts ? t.n_bytes * uint64_t(cfg.n_expert_used) / uint64_t(cfg.n_expert) : t.n_bytes;
    } else if (t.name == kEmbedName) {
      cost.embed_bytes += t.n_bytes;
      cost.embed_tensors.push_back(t.name);
    } else if (t.name.rfind("output", 0) == 0) {  // output.weight, output_norm.weight
      cost.head_bytes += t.n_bytes;
      cost.head_tensors.push_back(t.name);
    } else {
      cost.shared_bytes += t.n_bytes;
      cost.shared_tensors.push_back(t.name);
    }
  }
  if (cost.embed_tensors.empty()) return Error("{}: no tensor {}", file.path(), kEmbedName);
  if (cfg.tied_output) {
    cost.head_bytes += cost.embed_bytes;
    cost.head_tensors.push_back(kEmbedName);
  }
  cost.kv_bytes_per_token_layer = 2 * uint64_t(cfg.n_head_kv) * uint64_t(cfg.head_dim) * 4;
  cost.layer_kv_bytes_per_token.assign(cfg.n_layer, cost.kv_bytes_per_token_layer);
  cost.layer_state_bytes.assign(cfg.n_layer, 0);
  for (int l = 0; l < cfg.n_layer; ++l) {
    if (cfg.layer_kind(l) == LayerKind::kDeltaNet) {
      cost.layer_kv_bytes_per_token[l] = 0;
      cost.layer_state_bytes[l] = uint64_t(cfg.ssm_state_floats()) * 4;
    }
  }
  cost.boundary_bytes_per_token = uint64_t(cfg.n_embd) * 4 + 48;
  return cost;
}

}  // namespace kvasir
