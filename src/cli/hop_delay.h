// Slow links on a local ring: the --hop-* flags of `kvasir bench --stages` and `kvasir run`, which
// put a net::DelayProxy on every link (node::StartHopProxies: stage i dials the proxy, which
// forwards to stage i + 1), so a ring on one machine can be measured as if its hops crossed a
// network.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "net/delay_proxy.h"

namespace kvasir::cli {

struct HopFlags {
  double delay_ms = 0;
  double jitter_ms = 0;
  std::string jitter_shape = "uniform";
  double mbps = 0;  // megabits per second; 0: no cap
};

// --hop-delay-ms, --hop-jitter-ms, --hop-jitter, --hop-mbps.
void AddHopFlags(CLI::App& app, HopFlags* flags);

// The link every hop gets, or nothing when the flags ask for none; an error names the flag.
Result<std::optional<net::LinkShape>> HopShape(const HopFlags& flags);

// "20 ms one-way delay per hop, +-5 ms jitter (uniform), 100 Mbit/s": for tables and logs.
std::string HopText(const std::optional<net::LinkShape>& shape);

}  // namespace kvasir::cli
