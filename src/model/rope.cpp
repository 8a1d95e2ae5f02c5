#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace kvasir {
namespace {

// The dimension at which a rotation of `n_rotations` full turns over the original context falls,
// as YaRN defines it (in float, as llama.cpp computes it).
float CorrDim(int n_dims, int n_ctx_orig, float n_rotations, float base) {
  return static_cast<float>(n_dims) *
         std::log(static_cast<float>(n_ctx_orig) / (n_rotations * 2.0f * static_cast<float>(M_PI))) /
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

void RopeCosSin(const ModelConfig& cfg, std::span<const float> freq_factors, int pos, float* out) {
  const int half = cfg.n_rot / 2;
  KV_CHECK(freq_factors.empty() || static_cast<int>(freq_factors.size()) == half,
           "RopeCosSin: {} frequency factors for {} pairs", freq_factors.size(), half);
  const double freq_scale = cfg.rope_freq_scale;
  const double ext = cfg.yarn_ext_factor;
  float dims[2] = {0, 0};
  double mscale = cfg.rope_attn_factor;
  if (ext != 0.0) {
    YarnCorrDims(cfg, dims);
    mscale *= 1.0 + 0.1 * std::log(1.0 / freq_scale);
  }
  const int* sec = cfg.rope_sections;
  const int sect_dims = sec[0] + sec[1] + sec[2] + sec[3];
  for (int i = 0; i < half; ++i) {
    double p = pos;
    if (cfg.rope_imrope) {
      // IMROPE interleaves the sections t, h, w pair by pair; the rest take the fourth position
      // component, which text tokens leave at 0.
      const int sector = i % sect_dims;
      const bool thw = (sector % 3 == 0 && sector < 3 * sec[0]) ||
                       (sector % 3 == 1 && sector < 3 * sec[1]) ||
                       (sector % 3 == 2 && sector < 3 * sec[2]);
      if (!thw) p = 0;
    }
    double theta_extrap = p *
                          std::pow(static_cast<double>(cfg.rope_base),
                                   -2.0 * i / static_cast<double>(cfg.n_rot));
    if (!freq_factors.empty()) theta_extrap /= freq_factors[i];
    const double theta_interp = freq_scale * theta_extrap;
    double theta = theta_interp;
    if (ext != 0.0) {
      const double y = (i - dims[0]) / std::max(0.001, static_cast<double>(dims[1] - dims[0]));
      const double ramp = (1.0 - std::clamp(y, 0.0, 1.0)) * ext;
      theta = theta_interp * (1.0 - ramp) + theta_extrap * ramp;
    }
    out[2 * i] = static_cast<float>(std::cos(theta) * mscale);
    out[2 * i + 1] = static_cast<float>(std::sin(theta) * mscale);
  }
}

}  // namespace kvasir
