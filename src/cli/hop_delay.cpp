#include "cli/hop_delay.h"

#include <fmt/format.h>

#include <cmath>

namespace kvasir::cli {

void AddHopFlags(CLI::App& app, HopFlags* f) {
  app.add_option("--hop-delay-ms", f->delay_ms,
                 "one-way delay added to every link of the local ring (a delaying proxy per link)")
      ->capture_default_str();
  app.add_option("--hop-jitter-ms", f->jitter_ms,
                 "spread of that delay; bytes never overtake each other")
      ->capture_default_str();
  app.add_option("--hop-jitter", f->jitter_shape,
                 "jitter distribution: uniform (+-J) or normal (standard deviation J)")
      ->capture_default_str();
  app.add_option("--hop-mbps", f->mbps, "bandwidth cap of every link in Mbit/s; 0: none")
      ->capture_default_str();
}

Result<std::optional<net::LinkShape>> HopShape(const HopFlags& f) {
  if (!(f.delay_ms >= 0 && f.delay_ms <= 10000)) {
    return Error("--hop-delay-ms {} is not in 0..10000", f.delay_ms);
  }
  if (!(f.jitter_ms >= 0 && f.jitter_ms <= 10000)) {
    return Error("--hop-jitter-ms {} is not in 0..10000", f.jitter_ms);
  }
  if (!(f.mbps >= 0 && f.mbps <= 1e6)) return Error("--hop-mbps {} is not in 0..1000000", f.mbps);
  net::LinkShape s;
  if (f.jitter_shape == "uniform") {
    s.jitter_shape = net::JitterShape::kUniform;
  } else if (f.jitter_shape == "normal") {
    s.jitter_shape = net::JitterShape::kNormal;
  } else {
    return Error("--hop-jitter '{}' is not uniform or normal", f.jitter_shape);
  }
  if (f.delay_ms == 0 && f.jitter_ms == 0 && f.mbps == 0) {
    return std::optional<net::LinkShape>();
  }
  s.delay_ms = f.delay_ms;
  s.jitter_ms = f.jitter_ms;
  s.bytes_per_s = f.mbps * 1e6 / 8;
  return std::optional<net::LinkShape>(s);
}

std::string HopText(const std::optional<net::LinkShape>& s) {
  if (!s) return "direct loopback links";
  std::string text = fmt::format("{:g} ms one-way delay per hop", s->delay_ms);
  if (s->jitter_ms > 0) {
    text += fmt::format(", +-{:g} ms jitter ({})", s->jitter_ms,
                        s->jitter_shape == net::JitterShape::kNormal ? "normal" : "uniform");
  }
  if (s->bytes_per_s > 0) text += fmt::format(", {:g} Mbit/s", s->bytes_per_s * 8 / 1e6);
  return text;
}

}  // namespace kvasir::cli
