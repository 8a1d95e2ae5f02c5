// Rotary position embedding angles of one position: plain RoPE, linear scaling, YaRN, per-pair
// frequency factors (Llama 3.1+'s rope_freqs.weight) and IMROPE sections, as llama.cpp applies
// them. Pure arithmetic in double precision, shared by every backend that computes its angle
// tables on the host and by the model's tests (model/rope.h builds the parameters from a config).
#pragma once

#include <span>

namespace kvasir {

// Which dimensions a rotated pair joins.
enum class RopeType {
  kNormal,  // rotate interleaved pairs (x[2i], x[2i+1]) — llama
  kNeox,    // rotate (x[i], x[i + n_rot/2]) — qwen2, qwen3, qwen35 (IMROPE on text positions)
};

struct RopeAngleParams {
  int n_rot = 0;  // rotated dimensions (pairs: n_rot / 2)
  float base = 10000.0f;
  float freq_scale = 1.0f;            // 1 / scaling factor (linear and YaRN)
  float ext_factor = 0.0f;            // YaRN: weight of the extrapolated angle; 0 = no YaRN
  float attn_factor = 1.0f;           // magnitude factor of cos/sin
  float corr_dims[2] = {0.0f, 0.0f};  // YaRN correction dims [lo, hi] (only with ext_factor)
  bool imrope = false;                // IMROPE: a pair outside the t/h/w sections is at position 0
  int sections[4] = {0, 0, 0, 0};
  std::span<const float> freq_factors;  // empty, or n_rot / 2 angle divisors
};

// cos/sin of every rotated pair of position `pos`:
//   theta_extrap = pos * base^(-2i / n_rot) / freq_factors[i]     (factors default to 1)
//   theta_interp = freq_scale * theta_extrap
//   theta        = theta_interp                                    (ext_factor == 0)
//                = theta_interp * (1 - r) + theta_extrap * r,      r = ramp(i) * ext_factor
//   out[2i] = cos(theta) * mscale, out[2i + 1] = sin(theta) * mscale
// where ramp(i) = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1) over corr_dims [lo, hi], and
// mscale = attn_factor, times 1 + 0.1 ln(1 / freq_scale) with YaRN. Angles in double precision.
// out: [n_rot / 2, 2].
void RopeAngles(const RopeAngleParams& p, int pos, float* out);

}  // namespace kvasir
