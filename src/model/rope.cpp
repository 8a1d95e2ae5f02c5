#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace kvasir {
namespace {

// The dimension at which a rotation of `n_rotations` full turns over the original context falls,
// as YaRN defines it (in float, as llama.cpp computes it).
float CorrDim(int n_dims, int n_ctx_orig, float n_rotations, float base) {
  return static_cast<float>(n_dims) *
         std::log(static_cast<float>(n_ctx_orig) /
                  (n_rotations * 2.0f * static_cast<float>(M_PI))) /
         (2.0f * std::log(base));
}

}  // namespace

void YarnCorrDims(const ModelConfig& cfg, float dims[2]) {
  const float start =
      std::floor(CorrDim(cfg.n_rot, cfg.rope_orig_ctx, cfg.yarn_beta_fast, cfg.rope_base));
  const float end =
      std::ceil(CorrDim(cfg.n_rot, cfg.rope_orig_ctx, cfg.yarn_beta_slow, cfg.rope_base));
  dims[0] = std::max(0.0f, start);
  dims[1] = std::min(static_cast<float>(cfg.n_rot - 1), end);
}

RopeAngleParams MakeRopeParams(const ModelConfig& cfg, std::span<const float> freq_factors) {
  RopeAngleParams p;
  p.n_rot = cfg.n_rot;
  p.base = cfg.rope_base;
  p.freq_scale = cfg.rope_freq_scale;
  p.ext_factor = cfg.yarn_ext_factor;
  p.attn_factor = cfg.rope_attn_factor;
  if (cfg.yarn_ext_factor != 0.0f) YarnCorrDims(cfg, p.corr_dims);
  p.imrope = cfg.rope_imrope;
  std::copy(cfg.rope_sections, cfg.rope_sections + 4, p.sections);
  p.freq_factors = freq_factors;
  return p;
}

void RopeCosSin(const ModelConfig& cfg, std::span<const float> freq_factors, int pos, float* out) {
  RopeAngles(MakeRopeParams(cfg, freq_factors), pos, out);
}

}  // namespace kvasir
