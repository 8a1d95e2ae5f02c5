// kvasir profile: times this device on a model's layer shapes and prints a devices.json entry for
// `kvasir plan`. Decode is bound by reading the weights, so the figure is milliseconds per GiB of
// weights run per token: the layers of the model as one window, fed hidden states, one row at a
// time, median over -n steps after a warm-up.
//
// Links: `--link-serve ADDR:PORT` answers link probes (no model needed); `--link HOST:PORT`, given
// the next device's probe server, adds the measured uplink (median RTT of --link-pings round trips,
// bandwidth of --link-bytes sent) to the entry. src/ring/link_probe.h has the protocol.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/backend_flag.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "model/arch/registry.h"
#include "net/stream.h"
#include "ring/link_probe.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "profile";

struct ProfileOptions {
  std::string model_path;
  std::string name;
  int n_threads = 1;
  std::string backend = "cpu";
  int n_steps = 32;
  double memory_fraction = 0.8;
  // Link measurement (empty: none).
  std::string link;
  std::string link_host;
  uint16_t link_port = 0;
  ring::LinkProbeOptions link_probe;
};

// "67108864", "64K", "64M", "1G" (binary multiples, an optional "iB"/"B" after the letter).
std::optional<uint64_t> ParseByteCount(std::string text) {
  if (text.empty()) return std::nullopt;
  for (const char* suffix : {"iB", "B"}) {
    const size_t n = std::strlen(suffix);
    if (text.size() > n && text.compare(text.size() - n, n, suffix) == 0) {
      text.resize(text.size() - n);
      break;
    }
  }
  uint64_t scale = 1;
  switch (text.empty() ? '\0' : text.back()) {
    case 'K':
    case 'k':
      scale = uint64_t{1} << 10;
      break;
    case 'M':
    case 'm':
      scale = uint64_t{1} << 20;
      break;
    case 'G':
    case 'g':
      scale = uint64_t{1} << 30;
      break;
    default:
      break;
  }
  if (scale != 1) text.pop_back();
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  if (text.size() > 12) return std::nullopt;
  return std::stoull(text) * scale;
}

// `x` to `decimals` places, but never rounded down to 0 when it is positive.
double RoundKeep(double x, int decimals) {
  const double scale = std::pow(10.0, decimals);
  const double r = std::round(x * scale) / scale;
  return r > 0 || x <= 0 ? r : x;
}

Result<ring::LinkMeasurement> MeasureLink(const ProfileOptions& o) {
  auto m = ring::ProbeLink(o.link_host, o.link_port, o.link_probe);
  if (!m.ok()) return m.status().WithContext("link probe");
  std::fprintf(stderr,
               "profile: link to %s: rtt %.3f ms (median of %d; min %.3f, max %.3f), bandwidth "
               "%.1f Mbit/s (%s acknowledged in %.1f ms)\n",
               o.link.c_str(), m->rtt_ms, m->pings, m->rtt_min_ms, m->rtt_max_ms, m->bandwidth_mbps,
               HumanBytes(m->bytes).c_str(), m->transfer_ms);
  return m;
}

int RunProfile(const ProfileOptions& o) {
  // The link first: a probe server that is not there fails fast, before the timing.
  std::optional<ring::LinkMeasurement> link;
  if (!o.link.empty()) {
    auto m = MeasureLink(o);
    if (!m.ok()) return Fail(kCmd, m.status());
    link = *m;
  }
  auto file = OpenGguf(o.model_path);
  if (!file.ok()) return Fail(kCmd, file.status());
  auto cfg = LoadModelConfig(**file);
  if (!cfg.ok()) return Fail(kCmd, cfg.status());
  WindowOptions wopt;
  wopt.n_threads = o.n_threads;
  wopt.n_ctx = o.n_steps + 2;
  wopt.backend = o.backend;
  auto window = LayerWindow::Load(*file, {0, cfg->n_layer, false, false}, wopt);
  if (!window.ok()) return Fail(kCmd, window.status());
  LayerWindow& w = **window;
  if (Status s = w.OpenSequence(0); !s.ok()) return Fail(kCmd, s);
  std::vector<float> hidden(static_cast<size_t>(cfg->n_embd), 0.01f);  // [1, n_embd]
  ForwardOutput out;
  std::vector<double> ms;
  for (int step = 0; step <= o.n_steps; ++step) {
    Stopwatch clock;
    ForwardInput in;
    in.chunks = {SeqChunk{0, step, 1}};
    in.hidden = hidden;
    if (Status s = w.Forward(in, &out); !s.ok()) return Fail(kCmd, s);
    if (step > 0) ms.push_back(clock.Millis());  // step 0 warms the caches and page tables
  }
  std::sort(ms.begin(), ms.end());
  const double median_ms = ms[ms.size() / 2];
  const double gib = static_cast<double>(w.weight_bytes()) / (1ull << 30);
  const double ms_per_gib = median_ms / gib;
  char host[64] = "this-device";
  gethostname(host, sizeof(host) - 1);
  // The budget is a share of what the device has free now (host memory for the CPU).
  const DeviceInfo& device = w.device();
  const uint64_t available = device.free_bytes > 0 ? device.free_bytes : device.memory_bytes;
  const uint64_t memory = static_cast<uint64_t>(static_cast<double>(available) * o.memory_fraction);
  nlohmann::json entry = {{"name", o.name.empty() ? std::string(host) : o.name},
                          {"backend", device.address},
                          {"memory_bytes", memory},
                          {"ms_per_gib", ms_per_gib}};
  if (link) {
    entry["link"] = {{"rtt_ms", RoundKeep(link->rtt_ms, 3)},
                     {"bandwidth_mbps", RoundKeep(link->bandwidth_mbps, 1)}};
  }
  std::fprintf(stderr,
               "profile: %s (%s): %d layers, %s of weights, %.3f ms per token (median of %d, %d "
               "threads): %.2f ms per GiB; memory budget %s (%.0f%% of available)\n",
               device.address.c_str(), device.name.c_str(), cfg->n_layer,
               HumanBytes(w.weight_bytes()).c_str(), median_ms, o.n_steps, o.n_threads, ms_per_gib,
               HumanBytes(memory).c_str(), o.memory_fraction * 100);
  std::printf("%s\n", entry.dump(2).c_str());
  return kExitOk;
}

// Answers link probes until killed (or, with `once`, until one probe session is done).
int RunLinkServe(const std::string& address, bool once) {
  std::string host;
  uint16_t port = 0;
  if (Status s = net::ParseHostPort(address, &host, &port); !s.ok()) {
    return UsageError(kCmd, "--link-serve: " + s.message());
  }
  auto server = ring::LinkProbeServer::Bind(host, port);
  if (!server.ok()) return Fail(kCmd, server.status().WithContext("--link-serve"));
  std::fprintf(stderr, "profile: link probe server listening on %s:%u%s\n", host.c_str(),
               unsigned((*server)->port()), once ? " (one session)" : "");
  std::fflush(stderr);
  auto report = [](const Result<ring::LinkProbeSessionStats>& r) {
    if (!r.ok()) {
      std::fprintf(stderr, "profile: link probe failed: %s\n", r.status().message().c_str());
    } else {
      std::fprintf(stderr, "profile: link probe from %s: %d pings, %s received\n", r->peer.c_str(),
                   r->pings, HumanBytes(r->bytes).c_str());
    }
    std::fflush(stderr);
  };
  auto result = (*server)->Serve(once, report);
  if (!result.ok()) return Fail(kCmd, result.status());
  return kExitOk;
}

}  // namespace

int ProfileMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{"Time this device on a model's layers and print a devices.json entry.",
                 "kvasir profile"};
    ProfileOptions o;
    o.n_threads = DefaultThreads();
    std::string link_serve, link_bytes = "64M";
    bool once = false;
    app.add_option("-m,--model", o.model_path,
                   "GGUF model file to time (required unless --link-serve)");
    app.add_option("--name", o.name, "device name in the entry (default: host name)");
    app.add_option("-t,--threads", o.n_threads, "threads")->capture_default_str();
    AddBackendFlag(app, &o.backend);
    app.add_option("-n,--steps", o.n_steps, "decode steps to time")->capture_default_str();
    app.add_option("--memory-fraction", o.memory_fraction,
                   "share of available memory offered to the ring")
        ->capture_default_str();
    app.add_option("--link", o.link,
                   "measure the uplink to the next device, which runs --link-serve at HOST:PORT");
    auto* bytes_opt = app.add_option("--link-bytes", link_bytes,
                                     "bytes sent to time the bandwidth (64M, 1G, ...)")
                          ->capture_default_str();
    auto* pings_opt =
        app.add_option("--link-pings", o.link_probe.pings, "round trips timed for the RTT (median)")
            ->capture_default_str();
    app.add_option("--link-serve", link_serve,
                   "answer link probes on ADDR:PORT until killed (needs no model)");
    auto* once_opt = app.add_flag("--once", once, "with --link-serve: stop after one session");
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (!link_serve.empty()) {
      if (!o.model_path.empty() || !o.link.empty()) {
        return UsageError(kCmd, "--link-serve only answers probes; it takes no -m or --link");
      }
      return RunLinkServe(link_serve, once);
    }
    if (once_opt->count() > 0) return UsageError(kCmd, "--once goes with --link-serve");
    if (o.model_path.empty()) {
      return UsageError(kCmd, "-m,--model is required (unless --link-serve)");
    }
    if (o.link.empty() && (bytes_opt->count() > 0 || pings_opt->count() > 0)) {
      return UsageError(kCmd, "--link-bytes and --link-pings go with --link");
    }
    if (!o.link.empty()) {
      if (Status s = net::ParseHostPort(o.link, &o.link_host, &o.link_port); !s.ok()) {
        return UsageError(kCmd, "--link: " + s.message());
      }
      if (o.link_port == 0) return UsageError(kCmd, "--link: port 0 is not a server's port");
      auto n = ParseByteCount(link_bytes);
      if (!n || *n < (uint64_t{64} << 10) || *n > ring::kLinkProbeMaxBytes) {
        return UsageError(
            kCmd, fmt::format("--link-bytes '{}' is not a size from 64K to 64G", link_bytes));
      }
      o.link_probe.bytes = *n;
      if (o.link_probe.pings < 1 || o.link_probe.pings > 10000) {
        return UsageError(kCmd, "--link-pings must be in 1..10000");
      }
    }
    if (o.n_threads < 1) return UsageError(kCmd, "-t must be >= 1");
    if (auto code = CheckBackendFlag(kCmd, "--backend", o.backend)) return *code;
    if (o.n_steps < 1 || o.n_steps > 4096) return UsageError(kCmd, "-n must be in 1..4096");
    if (!(o.memory_fraction > 0 && o.memory_fraction <= 1)) {
      return UsageError(kCmd, "--memory-fraction must be in (0, 1]");
    }
    return RunProfile(o);
  });
}

}  // namespace kvasir::cli
