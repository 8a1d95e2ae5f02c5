// Rotary position embedding angles: plain RoPE, linear position scaling, YaRN, and the per-pair
// frequency factors of Llama 3.1+ files (the rope_freqs.weight tensor), as llama.cpp applies them.
#pragma once

#include <span>

#include "model/model_config.h"

namespace kvasir {

// cos/sin of every rotated pair of one position, scaled by the YaRN magnitude factor:
//   theta_extrap = pos * base^(-2i / n_rot) / freq_factors[i]     (factors default to 1)
//   theta_interp = freq_scale * theta_extrap
//   theta        = theta_interp                                    (ext_factor == 0)
//                = theta_interp * (1 - r) + theta_extrap * r,      r = ramp(i) * ext_factor
//   out[2i] = cos(theta) * mscale, out[2i + 1] = sin(theta) * mscale
// where ramp(i) = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1) over the YaRN correction dims
// [lo, hi], and mscale = cfg.rope_attn_factor, times 1 + 0.1 ln(1 / freq_scale) with YaRN.
// With IMROPE (cfg.rope_imrope) a pair outside the t/h/w sections is at position 0 (text tokens).
// Angles are computed in double precision. `freq_factors` is empty or has cfg.n_rot / 2 entries.
// out: [n_rot / 2, 2].
void RopeCosSin(const ModelConfig& cfg, std::span<const float> freq_factors, int pos, float* out);

// YaRN correction dims [lo, hi] for the config (pairs below lo extrapolate, above hi interpolate).
void YarnCorrDims(const ModelConfig& cfg, float dims[2]);

}  // namespace kvasir
