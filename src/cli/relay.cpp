// kvasir relay: bridges ring edges over WebSocket so that stages behind NAT only dial out (see
// docs/RELAY.md). SIGINT/SIGTERM stop it; SIGUSR1 logs its counters.
#include <fmt/format.h>
#include <signal.h>

#include <string>

#include "base/log.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/ring_options.h"
#include "net/stream.h"
#include "node/signals.h"
#include "relay/edge_token.h"
#include "relay/relay_server.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "relay";

void LogRelayStats(const relay::RelayServer& server) {
  const relay::RelayStats s = server.stats();
  KV_LOG_INFO("relay: {} connections, {} refused, {} edges paired, {} active, {} forwarded",
              s.connections, s.refused, s.edges_paired, s.edges_active,
              HumanBytes(s.bytes_forwarded));
}

}  // namespace

int RelayMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{
        "Bridge ring edges over WebSocket (wss:// with a certificate), so stages behind NAT "
        "only dial out.",
        "kvasir relay"};
    relay::RelayOptions o;
    std::string secret_file, log_level = "info";
    double hello_s = 10, pair_s = 30, idle_s = 120;
    double max_message_mib = 16;
    app.add_option("--listen", o.listen, "HOST:PORT to accept edges on")->capture_default_str();
    app.add_option("--tls-cert", o.tls_cert, "PEM certificate chain (with --tls-key): serve wss://")
        ->check(CLI::ExistingFile);
    app.add_option("--tls-key", o.tls_key, "PEM private key of the certificate")
        ->check(CLI::ExistingFile);
    app.add_option("--secret-file", secret_file,
                   "ring secret (>= 16 bytes) the edge tokens are made with; without it any "
                   "token is accepted")
        ->check(CLI::ExistingFile);
    app.add_option("--hello-timeout", hello_s, "seconds for TLS, the upgrade and the first message")
        ->capture_default_str();
    app.add_option("--pair-timeout", pair_s, "seconds an end waits for its partner")
        ->capture_default_str();
    app.add_option("--idle-timeout", idle_s, "seconds without traffic or answered pings")
        ->capture_default_str();
    app.add_option("--max-pending", o.max_pending_per_address,
                   "connections per address not yet paired")
        ->capture_default_str();
    app.add_option("--max-message", max_message_mib, "largest message in MiB")
        ->capture_default_str();
    app.add_option("--log-level", log_level, "debug, info, warn, error")->capture_default_str();
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (Status s = ApplyLogLevel(log_level); !s.ok()) return UsageError(kCmd, s.message());
    for (auto [name, v] : {std::pair{"--hello-timeout", hello_s},
                           {"--pair-timeout", pair_s},
                           {"--idle-timeout", idle_s}}) {
      if (!(v > 0 && v <= 86400)) {
        return UsageError(kCmd, fmt::format("{} must be in (0, 86400] seconds (got {})", name, v));
      }
    }
    if (o.max_pending_per_address < 1) return UsageError(kCmd, "--max-pending must be >= 1");
    if (!(max_message_mib >= 0.001 && max_message_mib <= 1024)) {
      return UsageError(kCmd, "--max-message must be in 0.001..1024 MiB");
    }
    if (o.tls_cert.empty() != o.tls_key.empty()) {
      return UsageError(kCmd, "--tls-cert and --tls-key go together");
    }
    o.hello_timeout_ms = static_cast<int>(hello_s * 1000);
    o.pair_timeout_ms = static_cast<int>(pair_s * 1000);
    o.idle_timeout_ms = static_cast<int>(idle_s * 1000);
    o.max_message_bytes = static_cast<uint64_t>(max_message_mib * 1024 * 1024);
    if (!secret_file.empty()) {
      auto secret = relay::ReadSecretFile(secret_file);
      if (!secret.ok()) return Fail(kCmd, secret.status());
      o.secret = *secret;
    }

    const sigset_t set = node::BlockStopSignals();

    auto server = relay::RelayServer::Start(o);
    if (!server.ok()) return Fail(kCmd, server.status());
    std::string host;
    uint16_t port = 0;
    (void)net::ParseHostPort(o.listen, &host, &port);
    if (o.secret.empty()) {
      KV_LOG_WARN("relay: no --secret-file: any client can attach to any edge");
    }
    // The line scripts wait for (kvasir run --relay, tests).
    std::fprintf(stderr, "relay: listening on %s:%u (%s)\n", host.c_str(), (*server)->port(),
                 (*server)->tls() ? "wss" : "ws, no TLS");
    std::fflush(stderr);
    node::WaitForStopSignal(set, [&server] { LogRelayStats(**server); });
    (*server)->Stop();
    LogRelayStats(**server);
    return kExitOk;
  });
}

}  // namespace kvasir::cli
