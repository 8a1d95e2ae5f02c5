#include "kernels/rope_angles.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace kvasir {

void RopeAngles(const RopeAngleParams& p, int pos, float* out) {
  const int half = p.n_rot / 2;
  KV_CHECK(p.freq_factors.empty() || static_cast<int>(p.freq_factors.size()) == half,
           "RopeAngles: {} frequency factors for {} pairs", p.freq_factors.size(), half);
  const double freq_scale = p.freq_scale;
  const double ext = p.ext_factor;
  double mscale = p.attn_factor;
  if (ext != 0.0) mscale *= 1.0 + 0.1 * std::log(1.0 / freq_scale);
  const int* sec = p.sections;
  const int sect_dims = sec[0] + sec[1] + sec[2] + sec[3];
  for (int i = 0; i < half; ++i) {
    double x = pos;
    if (p.imrope) {
      // IMROPE interleaves the sections t, h, w pair by pair; the rest take the fourth position
      // component, which text tokens leave at 0.
      const int sector = i % sect_dims;
      const bool thw = (sector % 3 == 0 && sector < 3 * sec[0]) ||
                       (sector % 3 == 1 && sector < 3 * sec[1]) ||
                       (sector % 3 == 2 && sector < 3 * sec[2]);
      if (!thw) x = 0;
    }
    double theta_extrap =
        x * std::pow(static_cast<double>(p.base), -2.0 * i / static_cast<double>(p.n_rot));
    if (!p.freq_factors.empty()) theta_extrap /= p.freq_factors[i];
    const double theta_interp = freq_scale * theta_extrap;
    double theta = theta_interp;
    if (ext != 0.0) {
      const double y = (i - p.corr_dims[0]) /
                       std::max(0.001, static_cast<double>(p.corr_dims[1] - p.corr_dims[0]));
      const double ramp = (1.0 - std::clamp(y, 0.0, 1.0)) * ext;
      theta = theta_interp * (1.0 - ramp) + theta_extrap * ramp;
    }
    out[2 * i] = static_cast<float>(std::cos(theta) * mscale);
    out[2 * i + 1] = static_cast<float>(std::sin(theta) * mscale);
  }
}

}  // namespace kvasir
