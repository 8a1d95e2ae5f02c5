#include "model/arch/registry.h"

#include <fmt/format.h>

#include <cmath>

namespace kvasir {

// Defined in one file per architecture.
Status LoadLlamaConfig(const GgufFile& file, ModelConfig* cfg);
Status LoadQwen2Config(const GgufFile& file, ModelConfig* cfg);
Status LoadQwen3Config(const GgufFile& file, ModelConfig* cfg);
Status LoadQwen35Config(const GgufFile& file, ModelConfig* cfg);
Status LoadQwen35MoeConfig(const GgufFile& file, ModelConfig* cfg);

namespace {
constexpr ArchSpec kArchs[] = {
    {"llama", LoadLlamaConfig},
    {"qwen2", LoadQwen2Config},
    {"qwen3", LoadQwen3Config},
    {"qwen35", LoadQwen35Config},
    {"qwen35moe", LoadQwen35MoeConfig},
};
}  // namespace

std::string SupportedArchList() {
  std::string out;
  for (const auto& a : kArchs) {
    if (!out.empty()) out += ", ";
    out += a.name;
  }
  return out;
}

Result<ArchSpec> LookupArch(const GgufFile& file) {
  KV_ASSIGN_OR_RETURN(std::string arch, file.GetString("general.architecture"));
  for (const auto& a : kArchs) {
    if (a.name == arch) return a;
  }
  return Error("{}: architecture '{}' is not supported (supported: {})", file.path(), arch,
               SupportedArchList());
}

Result<ModelConfig> LoadModelConfig(const GgufFile& file) {
  KV_ASSIGN_OR_RETURN(ArchSpec spec, LookupArch(file));
  ModelConfig cfg;
  cfg.arch = std::string(spec.name);
  if (auto name = file.GetString("general.name"); name.ok()) cfg.name = *name;
  KV_RETURN_IF_ERROR(spec.load_config(file, &cfg));
  return cfg;
}

int LayerOfTensorName(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  const size_t dot = name.find('.', 4);
  if (dot == std::string_view::npos || dot == 4 || dot > 12) return -1;
  int layer = 0;
  for (size_t i = 4; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    layer = layer * 10 + (name[i] - '0');
  }
  return layer;
}

Result<int> GetPositiveInt(const GgufFile& file, const std::string& key) {
  KV_ASSIGN_OR_RETURN(uint64_t v, file.GetUint(key));
  if (v == 0 || v > (1u << 30)) return Error("{}: {} = {} is out of range", file.path(), key, v);
  return static_cast<int>(v);
}

namespace {


// rope.scaling.* as llama.cpp reads them: a missing type means linear, the factor (or the older
// rope.scale_linear) gives freq_scale = 1 / factor, and YaRN's magnitude factor is folded into
// rope_attn_factor the way llama.cpp folds it into its attn_factor.
Status LoadRopeScaling(const GgufFile& file, const std::string& p, ModelConfig* cfg) {
  std::string scaling = "linear";
  if (file.Find(p + ".rope.scaling.type") != nullptr) {
    KV_ASSIGN_OR_RETURN(scaling, file.GetString(p + ".rope.scaling.type"));
  }
  double factor = 0;
  if (file.Find(p + ".rope.scaling.factor") != nullptr) {
    KV_ASSIGN_OR_RETURN(factor, file.GetFloat(p + ".rope.scaling.factor"));
  } else if (file.Find(p + ".rope.scale_linear") != nullptr) {
    KV_ASSIGN_OR_RETURN(factor, file.GetFloat(p + ".rope.scale_linear"));
  }
  if (factor == 0) factor = 1;
  if (!(factor > 0 && factor < 1e6)) {
    return Error("{}: rope.scaling.factor {} must be positive", file.path(), factor);
  }
  if (scaling == "none") {
    cfg->rope_scaling = RopeScaling::kNone;
    factor = 1;
  } else if (scaling == "linear") {
    cfg->rope_scaling = factor == 1 ? RopeScaling::kNone : RopeScaling::kLinear;
  } else if (scaling == "yarn") {
    cfg->rope_scaling = RopeScaling::kYarn;
  } else {
    return Error("{}: rope scaling '{}' is not supported (supported: none, linear, yarn)",
                 file.path(), scaling);
  }
  cfg->rope_freq_scale = static_cast<float>(1.0 / factor);
  KV_ASSIGN_OR_RETURN(uint64_t orig_ctx, file.GetUintOr(p + ".rope.scaling.original_context_length",
                                                        static_cast<uint64_t>(cfg->n_ctx_train)));
  if (orig_ctx == 0 || orig_ctx > (1u << 30)) {
    return Error("{}: rope.scaling.original_context_length {} is out of range", file.path(),
                 orig_ctx);
  }
  cfg->rope_orig_ctx = static_cast<int>(orig_ctx);
  const bool yarn = cfg->rope_scaling == RopeScaling::kYarn;
  KV_ASSIGN_OR_RETURN(double ext, file.GetFloatOr(p + ".rope.scaling.yarn_ext_factor", -1.0));
  if (ext < 0) ext = yarn ? 1.0 : 0.0;
  KV_ASSIGN_OR_RETURN(double attn, file.GetFloatOr(p + ".rope.scaling.yarn_attn_factor", 1.0));
  KV_ASSIGN_OR_RETURN(double beta_fast, file.GetFloatOr(p + ".rope.scaling.yarn_beta_fast", 32.0));
  KV_ASSIGN_OR_RETURN(double beta_slow, file.GetFloatOr(p + ".rope.scaling.yarn_beta_slow", 1.0));
  KV_ASSIGN_OR_RETURN(double log_mul, file.GetFloatOr(p + ".rope.scaling.yarn_log_multiplier", 0.0));
  KV_ASSIGN_OR_RETURN(double rope_attn, file.GetFloatOr(p + ".rope.scaling.attn_factor", 1.0));
  if (!(ext <= 1e3 && attn > 0 && attn < 1e3 && beta_fast > 0 && beta_slow > 0 &&
        beta_fast < 1e6 && beta_slow < 1e6 && std::isfinite(log_mul) && rope_attn > 0 &&
        rope_attn < 1e3)) {
    return Error("{}: rope.scaling.yarn_* / attn_factor values are out of range", file.path());
  }
  if (ext != 0) {
    // llama.cpp's magnitude factor for a scale s: 1 + 0.1 m ln(s) for s > 1.
    auto mscale = [](double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; };
    attn = log_mul != 0 ? mscale(factor, 1.0) / mscale(factor, log_mul) : mscale(factor, 1.0);
    // RopeCosSin multiplies by 1 + 0.1 ln(factor) again, as ggml's rope does; cancel it here.
    attn /= 1.0 + 0.1 * std::log(factor);
  }
  cfg->yarn_ext_factor = static_cast<float>(ext);
  cfg->yarn_beta_fast = static_cast<float>(beta_fast);
  cfg->yarn_beta_slow = static_cast<float>(beta_slow);
  cfg->rope_attn_factor = static_cast<float>(attn * rope_attn);
  cfg->rope_freq_factors = file.FindTensor("rope_freqs.weight") != nullptr;
  return Status::Ok();
}

}  // namespace

Status LoadLlamaFamilyConfig(const GgufFile& file, std::string_view prefix, ModelConfig* cfg) {
  const std::string p(prefix);
  KV_ASSIGN_OR_RETURN(cfg->n_layer, GetPositiveInt(file, p + ".block_count"));
  KV_ASSIGN_OR_RETURN(cfg->n_embd, GetPositiveInt(file, p + ".embedding_length"));
  // A mixture-of-experts model may have no dense FFN width; its arch file reads the expert keys.
  if (file.Find(p + ".feed_forward_length") != nullptr || file.Find(p + ".expert_count") == nullptr) {
    KV_ASSIGN_OR_RETURN(cfg->n_ff, GetPositiveInt(file, p + ".feed_forward_length"));
  }
  KV_ASSIGN_OR_RETURN(cfg->n_head, GetPositiveInt(file, p + ".attention.head_count"));
  KV_ASSIGN_OR_RETURN(uint64_t n_head_kv,
                      file.GetUintOr(p + ".attention.head_count_kv", cfg->n_head));
  cfg->n_head_kv = static_cast<int>(n_head_kv);
  if (cfg->n_head_kv <= 0 || cfg->n_head % cfg->n_head_kv != 0) {
    return Error("{}: attention.head_count {} is not a multiple of head_count_kv {}", file.path(),
                 cfg->n_head, cfg->n_head_kv);
  }
  if (cfg->n_embd % cfg->n_head != 0 && file.Find(p + ".attention.key_length") == nullptr) {
    return Error("{}: embedding_length {} is not a multiple of head_count {}", file.path(),
                 cfg->n_embd, cfg->n_head);
  }
  KV_ASSIGN_OR_RETURN(uint64_t head_dim,
                      file.GetUintOr(p + ".attention.key_length", cfg->n_embd / cfg->n_head));
  KV_ASSIGN_OR_RETURN(uint64_t v_dim, file.GetUintOr(p + ".attention.value_length", head_dim));
  if (head_dim == 0 || head_dim > 4096 || v_dim != head_dim) {
    return Error("{}: attention key_length {} / value_length {} not supported", file.path(),
                 head_dim, v_dim);
  }
  cfg->head_dim = static_cast<int>(head_dim);
  KV_ASSIGN_OR_RETURN(uint64_t n_rot, file.GetUintOr(p + ".rope.dimension_count", head_dim));
  if (n_rot == 0 || n_rot > head_dim || n_rot % 2 != 0) {
    return Error("{}: rope.dimension_count {} must be even and at most the head size {}",
                 file.path(), n_rot, head_dim);
  }
  cfg->n_rot = static_cast<int>(n_rot);
  KV_ASSIGN_OR_RETURN(uint64_t n_ctx, file.GetUintOr(p + ".context_length", 2048));
  cfg->n_ctx_train = static_cast<int>(std::min<uint64_t>(n_ctx, 1u << 24));
  KV_ASSIGN_OR_RETURN(double eps, file.GetFloatOr(p + ".attention.layer_norm_rms_epsilon", 1e-5));
  if (!(eps > 0 && eps < 1)) {
    return Error("{}: attention.layer_norm_rms_epsilon {} out of range", file.path(), eps);
  }
  cfg->rms_eps = static_cast<float>(eps);
  KV_ASSIGN_OR_RETURN(double base, file.GetFloatOr(p + ".rope.freq_base", 10000.0));
  if (!(base > 1)) return Error("{}: rope.freq_base {} must be > 1", file.path(), base);
  cfg->rope_base = static_cast<float>(base);
  KV_RETURN_IF_ERROR(LoadRopeScaling(file, p, cfg));

  const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr) {
    // A stage slice without embeddings still knows the vocabulary size from its tokenizer.
    const GgufArray* tokens = file.GetArray("tokenizer.ggml.tokens");
    if (tokens == nullptr) {
      return Error("{}: neither token_embd.weight nor tokenizer.ggml.tokens tells the vocab size",
                   file.path());
    }
    cfg->n_vocab = static_cast<int>(tokens->size());
  } else {
    if (embd->ne[0] != static_cast<uint64_t>(cfg->n_embd) || embd->n_dims != 2) {
      return Error("{}: tensor token_embd.weight has shape [{}, {}], expected [{}, n_vocab]",
                   file.path(), embd->ne[0], embd->ne[1], cfg->n_embd);
    }
    cfg->n_vocab = static_cast<int>(embd->ne[1]);
  }
  cfg->tied_output = file.FindTensor("output.weight") == nullptr;
  if (file.Find("kvasir.window.tied_output") != nullptr) {
    KV_ASSIGN_OR_RETURN(cfg->tied_output, file.GetBool("kvasir.window.tied_output"));
  }
  return Status::Ok();
}

}  // namespace kvasir
