// Rotary position embedding angles of a model: the kernels' RopeAngles (plain RoPE, linear
// scaling, YaRN, rope_freqs.weight factors, IMROPE) with its parameters taken from a ModelConfig.
#pragma once

#include <span>

#include "kernels/rope_angles.h"
#include "model/model_config.h"

namespace kvasir {

// The angle parameters of `cfg` (YaRN's correction dims computed when cfg.yarn_ext_factor != 0).
// `freq_factors` is empty or has cfg.n_rot / 2 entries, and must outlive the result.
RopeAngleParams MakeRopeParams(const ModelConfig& cfg, std::span<const float> freq_factors);

// cos/sin of every rotated pair of one position (RopeAngles of MakeRopeParams(cfg, freq_factors)).
// out: [n_rot / 2, 2].
void RopeCosSin(const ModelConfig& cfg, std::span<const float> freq_factors, int pos, float* out);

// YaRN correction dims [lo, hi] for the config (pairs below lo extrapolate, above hi interpolate).
void YarnCorrDims(const ModelConfig& cfg, float dims[2]);

}  // namespace kvasir
