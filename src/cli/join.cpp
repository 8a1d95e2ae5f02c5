// kvasir join: give this machine to the network. Claims the best window of a model the market
// wants that fits --memory, fetches only that window, serves it in its ring, and releases it on
// SIGINT/SIGTERM (docs/MARKET.md, "kvasir join").
#include <fmt/format.h>

#include "base/human.h"
#include "base/log.h"
#include "cli/backend_flag.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/ring_options.h"
#include "market/joiner.h"
#include "net/stream.h"
#include "net/url.h"
#include "node/signals.h"
#include "node/slice_cache.h"
#include "ring/node_key.h"

namespace kvasir::cli {
namespace {
constexpr const char* kCmd = "join";
}  // namespace

int JoinMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{
        "Join the network: claim a window of a model the market wants, fetch it and "
        "serve it in its ring.",
        "kvasir join"};
    market::JoinOptions o;
    o.n_threads = DefaultThreads();
    std::string key_file, memory, log_level = "info";
    app.add_option("--market", o.market_url, "http[s]://HOST[:PORT] of the market")->required();
    app.add_option("--key", key_file,
                   "node key (created on first use; default " + ring::DefaultKeyPath() + ")");
    app.add_option("--memory", memory,
                   "memory this node gives (weights + KV + runtime), e.g. 2GiB (default: 80% of "
                   "what the --backend device has free)");
    app.add_flag("--behind-nat", o.behind_nat,
                 "this machine accepts no inbound connections: both ring links go through the "
                 "market's relay");
    app.add_option("--cache", o.cache_dir,
                   "where fetched windows are kept (default: $KVASIR_CACHE_DIR, "
                   "$XDG_CACHE_HOME/kvasir or ~/.cache/kvasir)");
    app.add_option("--listen", o.listen, "HOST:PORT the predecessor and clients connect to")
        ->capture_default_str();
    app.add_option("--advertise", o.advertise,
                   "HOST:PORT others should dial (default: this node's address as the market "
                   "sees it, and the listen port)");
    app.add_option("--model", o.model, "claim only windows of this model");
    app.add_flag("--standby", o.standby,
                 "stand by: hold a hot standby of the held window that most needs one (none yet, "
                 "then the fewest), take its place when its stage dies, and its claim when the "
                 "market frees it");
    double link_timeout_s = o.link_timeout_ms / 1000.0,
           repair_timeout_s = o.repair_timeout_ms / 1000.0;
    app.add_option("--link-timeout", link_timeout_s,
                   "seconds after which a silent neighbour is down")
        ->capture_default_str();
    app.add_option("--repair-timeout", repair_timeout_s,
                   "seconds the stage holds sessions across a link that went down, for a standby "
                   "or the same stage to take its place (0: they end at once)")
        ->capture_default_str();
    app.add_option("-t,--threads", o.n_threads, "compute threads")->capture_default_str();
    AddBackendFlag(app, &o.backend);
    app.add_option("--ca", o.ca_file, "PEM certificates to trust for https:// and wss://")
        ->check(CLI::ExistingFile);
    app.add_option("--poll", o.poll_s, "seconds between map polls while waiting")
        ->capture_default_str();
    app.add_option("--log-level", log_level, "debug, info, warn, error")->capture_default_str();
    RevealFlags reveal;
    AddRevealFlags(app, &reveal);
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (Status s = ApplyLogLevel(log_level); !s.ok()) return UsageError(kCmd, s.message());
    if (auto u = net::ParseUrl(o.market_url); !u.ok()) {
      return UsageError(kCmd, "--market: " + u.status().message());
    }
    if (o.n_threads < 1) return UsageError(kCmd, "-t must be >= 1");
    if (const int hw = DefaultThreads(); o.n_threads > hw) {
      return UsageError(
          kCmd, fmt::format("-t {}: this machine runs {} threads at once", o.n_threads, hw));
    }
    // Addresses are checked here too, so that no claim is taken and nothing fetched for a typo.
    for (auto [flag, text] : {std::pair{"--listen", &o.listen}, {"--advertise", &o.advertise}}) {
      std::string host;
      uint16_t port = 0;
      if (text->empty()) continue;
      if (Status a = net::ParseHostPort(*text, &host, &port); !a.ok()) {
        return UsageError(kCmd, fmt::format("{} {}: {}", flag, *text, a.message()));
      }
    }
    if (auto code = CheckBackendFlag(kCmd, "--backend", o.backend)) return *code;
    if (o.poll_s < 0.1 || o.poll_s > 600) return UsageError(kCmd, "--poll must be from 0.1 to 600");
    if (!(link_timeout_s >= 0.5 && link_timeout_s <= 600)) {
      return UsageError(
          kCmd, fmt::format("--link-timeout {} must be from 0.5 to 600 seconds", link_timeout_s));
    }
    if (!(repair_timeout_s >= 0 && repair_timeout_s <= 3600)) {
      return UsageError(kCmd, fmt::format("--repair-timeout {} must be from 0 to 3600 seconds",
                                          repair_timeout_s));
    }
    o.link_timeout_ms = static_cast<int>(link_timeout_s * 1000);
    o.repair_timeout_ms = static_cast<int>(repair_timeout_s * 1000);
    if (auto r = ApplyRevealFlags(reveal); r.ok()) {
      o.reveal = *r;
      o.test_fault_noise = reveal.test_fault_noise;
    } else {
      return UsageError(kCmd, r.status().message());
    }
    if (memory.empty()) {
      // The market is told what the backend's device can hold: host memory for the CPU, the
      // card's for a GPU.
      auto device = FindDevice(o.backend);
      if (!device.ok()) return Fail(kCmd, device.status());
      const uint64_t free = device->free_bytes > 0 ? device->free_bytes : device->memory_bytes;
      o.memory_bytes = static_cast<uint64_t>(static_cast<double>(free) * 0.8);
      if (o.memory_bytes == 0) {
        return UsageError(
            kCmd, fmt::format("cannot read the free memory of {}; give --memory", device->address));
      }
      KV_LOG_INFO("join: offering {} of {} ({}: {} free)", HumanBytes(o.memory_bytes),
                  device->address, device->name, HumanBytes(free));
    } else {
      auto m = ParseByteSize(memory);
      if (!m.ok()) return UsageError(kCmd, "--memory: " + m.status().message());
      o.memory_bytes = *m;
    }
    if (o.cache_dir.empty()) o.cache_dir = node::DefaultSliceDir();
    const std::string path = key_file.empty() ? ring::DefaultKeyPath() : key_file;
    bool created = false;
    auto key = ring::NodeKey::LoadOrCreate(path, &created);
    if (!key.ok()) return Fail(kCmd, key.status());
    if (created) KV_LOG_INFO("join: created node key {}", path);
    o.key = std::make_shared<const ring::NodeKey>(std::move(key).value());

    const sigset_t set = node::BlockStopSignals();
    auto joiner = market::Joiner::Create(o);
    if (!joiner.ok()) return Fail(kCmd, joiner.status());
    market::Joiner* j = joiner->get();
    Status st = node::RunUntilSignal(
        set, [j] { return j->Run(); },
        [j](int sig) {
          KV_LOG_INFO("join: {}: releasing the claim and leaving", node::StopSignalName(sig));
          j->Stop();
        },
        [j] {
          const auto s = j->state();
          KV_LOG_INFO(
              "join: claim {} ({} ring {} window {}, layers {}:{}), serving epoch {}, {} "
              "stage starts, {} receipts submitted, {} refused",
              s.claim, s.model, s.ring, s.window, s.first, s.last, s.serving_epoch,
              s.stages_started, s.receipts_submitted, s.receipts_refused);
        });
    j->Stop();
    if (!st.ok()) return Fail(kCmd, st);
    return kExitOk;
  });
}

}  // namespace kvasir::cli
