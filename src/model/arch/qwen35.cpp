// qwen35 and qwen35moe (Qwen3.5): hybrid stacks where every full_attention_interval-th layer is gated
// full attention (attn_q holds query and gate per head, per-head q/k RMSNorm, IMROPE) and the others
// are gated DeltaNet (ssm.*). qwen35 has a dense SwiGLU FFN; qwen35moe routes each token to
// expert_used_count of expert_count experts and adds a shared expert scaled by a sigmoid gate.
// post_attention_norm is the pre-FFN norm. Trailing nextn_predict_layers blocks (multi-token
// prediction) are counted in block_count but are not part of the layer stack; they read the
// normed hidden state.
#include <variant>

#include "model/arch/registry.h"

namespace kvasir {
namespace {

// An integer array key as int64 values, or an error naming the key.
Result<std::vector<int64_t>> GetIntArray(const GgufFile& file, const std::string& key) {
  const GgufArray* a = file.GetArray(key);
  if (a == nullptr) return Error("{}: {} is missing or not an array", file.path(), key);
  std::vector<int64_t> out;
  bool ok = true;
  std::visit(
      [&](const auto& items) {
        using T = typename std::decay_t<decltype(items)>::value_type;
        if constexpr (std::is_integral_v<T>) {
          for (const T v : items) out.push_back(static_cast<int64_t>(v));
        } else {
          ok = false;
        }
      },
      a->items);
  if (!ok) return Error("{}: {} is not an array of integers", file.path(), key);
  return out;
}

Status LoadLayerKinds(const GgufFile& file, const std::string& p, int n_layer_all,
                      ModelConfig* cfg) {
  cfg->layer_kinds.assign(cfg->n_layer, LayerKind::kAttention);
  if (file.Find(p + ".attention.recurrent_layers") != nullptr) {
    KV_ASSIGN_OR_RETURN(std::vector<int64_t> recurrent,
                        GetIntArray(file, p + ".attention.recurrent_layers"));
    if (recurrent.size() != static_cast<size_t>(n_layer_all) &&
        recurrent.size() != static_cast<size_t>(cfg->n_layer)) {
      return Error("{}: attention.recurrent_layers has {} entries for {} layers", file.path(),
                   recurrent.size(), n_layer_all);
    }
    for (int i = 0; i < cfg->n_layer; ++i) {
      if (recurrent[i] != 0 && recurrent[i] != 1) {
        return Error("{}: attention.recurrent_layers[{}] = {} is not 0 or 1", file.path(), i,
                     recurrent[i]);
      }
      if (recurrent[i] != 0) cfg->layer_kinds[i] = LayerKind::kDeltaNet;
    }
    return Status::Ok();
  }
  KV_ASSIGN_OR_RETURN(uint64_t interval, file.GetUintOr(p + ".full_attention_interval", 4));
  if (interval == 0 || interval > (1u << 20)) {
    return Error("{}: full_attention_interval {} is out of range", file.path(), interval);
  }
  for (int i = 0; i < cfg->n_layer; ++i) {
    if ((static_cast<uint64_t>(i) + 1) % interval != 0) cfg->layer_kinds[i] = LayerKind::kDeltaNet;
  }
  return Status::Ok();
}

Status LoadDeltaNet(const GgufFile& file, const std::string& p, ModelConfig* cfg) {
  KV_ASSIGN_OR_RETURN(cfg->ssm_conv_kernel, GetPositiveInt(file, p + ".ssm.conv_kernel"));
  KV_ASSIGN_OR_RETURN(cfg->ssm_state, GetPositiveInt(file, p + ".ssm.state_size"));
  KV_ASSIGN_OR_RETURN(cfg->ssm_n_k_heads, GetPositiveInt(file, p + ".ssm.group_count"));
  KV_ASSIGN_OR_RETURN(cfg->ssm_n_v_heads, GetPositiveInt(file, p + ".ssm.time_step_rank"));
  KV_ASSIGN_OR_RETURN(cfg->ssm_inner, GetPositiveInt(file, p + ".ssm.inner_size"));
  if (cfg->ssm_conv_kernel > 64) {
    return Error("{}: ssm.conv_kernel {} is out of range (at most 64)", file.path(),
                 cfg->ssm_conv_kernel);
  }
  if (cfg->ssm_state > 1024) {
    return Error("{}: ssm.state_size {} is out of range (at most 1024)", file.path(),
                 cfg->ssm_state);
  }
  if (cfg->ssm_n_v_heads % cfg->ssm_n_k_heads != 0) {
    return Error("{}: ssm.time_step_rank {} (value heads) is not a multiple of ssm.group_count {}",
                 file.path(), cfg->ssm_n_v_heads, cfg->ssm_n_k_heads);
  }
  if (static_cast<int64_t>(cfg->ssm_n_v_heads) * cfg->ssm_state != cfg->ssm_inner) {
    return Error("{}: ssm.inner_size {} is not ssm.time_step_rank {} x ssm.state_size {}",
                 file.path(), cfg->ssm_inner, cfg->ssm_n_v_heads, cfg->ssm_state);
  }
  return Status::Ok();
}

Status LoadExperts(const GgufFile& file, const std::string& p, ModelConfig* cfg) {
  KV_ASSIGN_OR_RETURN(cfg->n_expert, GetPositiveInt(file, p + ".expert_count"));
  KV_ASSIGN_OR_RETURN(cfg->n_expert_used, GetPositiveInt(file, p + ".expert_used_count"));
  if (cfg->n_expert > 4096 || cfg->n_expert_used > cfg->n_expert) {
    return Error("{}: expert_used_count {} of expert_count {} is out of range", file.path(),
                 cfg->n_expert_used, cfg->n_expert);
  }
  if (file.Find(p + ".expert_feed_forward_length") != nullptr) {
    KV_ASSIGN_OR_RETURN(cfg->n_ff_exp, GetPositiveInt(file, p + ".expert_feed_forward_length"));
  } else if (cfg->n_ff >= cfg->n_expert_used) {
    cfg->n_ff_exp = cfg->n_ff / cfg->n_expert_used;  // llama.cpp's fallback
  } else {
    return Error("{}: neither expert_feed_forward_length nor feed_forward_length is set",
                 file.path());
  }
  if (file.Find(p + ".expert_shared_feed_forward_length") != nullptr) {
    KV_ASSIGN_OR_RETURN(cfg->n_ff_shexp,
                        GetPositiveInt(file, p + ".expert_shared_feed_forward_length"));
  } else if (cfg->n_ff > 0) {
    cfg->n_ff_shexp = cfg->n_ff;
  } else {
    return Error("{}: expert_shared_feed_forward_length is missing", file.path());
  }
  return Status::Ok();
}

Status LoadHybrid(const GgufFile& file, const std::string& p, bool moe, ModelConfig* cfg) {
  KV_RETURN_IF_ERROR(LoadLlamaFamilyConfig(file, p, cfg));
  cfg->rope_type = RopeType::kNeox;
  cfg->qk_norm = true;
  cfg->attn_output_gate = true;
  cfg->ffn_norm_tensor = "post_attention_norm";
  if (!moe && cfg->n_ff == 0) {
    return Error("{}: {}.feed_forward_length is missing", file.path(), p);
  }

  KV_ASSIGN_OR_RETURN(uint64_t nextn, file.GetUintOr(p + ".nextn_predict_layers", 0));
  if (nextn >= static_cast<uint64_t>(cfg->n_layer)) {
    return Error("{}: nextn_predict_layers {} leaves none of the {} blocks", file.path(), nextn,
                 cfg->n_layer);
  }
  const int n_layer_all = cfg->n_layer;
  cfg->n_layer_nextn = static_cast<int>(nextn);
  // Qwen3.5's MTP block was trained on the normed hidden state (what llama.cpp feeds it too).
  cfg->nextn_normed_hidden = true;
  cfg->n_layer -= cfg->n_layer_nextn;

  KV_ASSIGN_OR_RETURN(std::vector<int64_t> sections,
                      GetIntArray(file, p + ".rope.dimension_sections"));
  if (sections.empty() || sections.size() > 4) {
    return Error("{}: rope.dimension_sections has {} entries (1 to 4 expected)", file.path(),
                 sections.size());
  }
  for (size_t i = 0; i < sections.size(); ++i) {
    if (sections[i] < 0 || sections[i] > 4096) {
      return Error("{}: rope.dimension_sections[{}] = {} is out of range", file.path(), i,
                   sections[i]);
    }
    cfg->rope_sections[i] = static_cast<int>(sections[i]);
  }
  if (cfg->rope_sections[0] + cfg->rope_sections[1] + cfg->rope_sections[2] +
          cfg->rope_sections[3] == 0) {
    return Error("{}: rope.dimension_sections are all 0", file.path());
  }
  cfg->rope_imrope = true;

  KV_RETURN_IF_ERROR(LoadLayerKinds(file, p, n_layer_all, cfg));
  KV_RETURN_IF_ERROR(LoadDeltaNet(file, p, cfg));
  if (moe) KV_RETURN_IF_ERROR(LoadExperts(file, p, cfg));
  return Status::Ok();
}

}  // namespace

Status LoadQwen35Config(const GgufFile& file, ModelConfig* cfg) {
  return LoadHybrid(file, "qwen35", /*moe=*/false, cfg);
}

Status LoadQwen35MoeConfig(const GgufFile& file, ModelConfig* cfg) {
  return LoadHybrid(file, "qwen35moe", /*moe=*/true, cfg);
}

}  // namespace kvasir
