// kvasir market: the coverage/demand service (docs/MARKET.md). `kvasir market --db D --listen A`
// serves it; `kvasir market add-model` registers a model; `kvasir market balances` prints who
// earned what. SIGINT/SIGTERM stop the server; every answered change is already on disk.
#include <fmt/format.h>
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "base/human.h"
#include "base/log.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/ring_options.h"
#include "market/api.h"
#include "market/market_server.h"
#include "market/model_spec.h"
#include "market/ring_check.h"
#include "market/store.h"
#include "net/url.h"
#include "node/signals.h"
#include "relay/edge_token.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "market";

int AddModel(int argc, char** argv) {
  CLI::App app{"Register a model with the market: its identity, digests and rings of windows.",
               "kvasir market add-model"};
  std::string db;
  market::ModelSpecOptions o;
  bool replace = false;
  app.add_option("--db", db, "market database: a SQLite file, or postgresql://...")->required();
  app.add_option("-m,--model", o.model_path, "local GGUF file (read and hashed)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--url", o.url, "http[s] URL stages fetch the model from")->required();
  app.add_option("--name", o.name, "name clients and nodes use (default: the file's stem)");
  app.add_option("--rings", o.rings, "complete copies of the model to cover")
      ->capture_default_str();
  auto* windows = app.add_option("--windows", o.windows, "split each ring evenly into N windows");
  app.add_option("--devices", o.devices_path, "plan the windows for these devices (devices.json)")
      ->check(CLI::ExistingFile)
      ->excludes(windows);
  app.add_option("--ctx", o.ctx,
                 "context each stage reserves (enters each window's memory, and bounds the rows "
                 "of a session; default: min(2048, the model's))");
  app.add_option("--max-rows-per-s", o.max_rows_per_s,
                 "the most token rows per second one ring can run, which bounds its credit "
                 "(default: estimated for the fastest devices, docs/MARKET.md)");
  app.add_flag("--replace", replace, "replace a model of the same name (drops its claims)");
  if (auto code = ParseArgs(app, "market add-model", argc, argv)) return *code;
  if (auto u = net::ParseUrl(o.url); !u.ok()) return UsageError(kCmd, u.status().message());
  if (o.windows == 0 && o.devices_path.empty()) {
    return UsageError(kCmd, "give --windows N or --devices FILE");
  }
  if (o.ctx < 0) return UsageError(kCmd, "--ctx must be positive");
  if (!(o.max_rows_per_s >= 0) || !std::isfinite(o.max_rows_per_s)) {
    return UsageError(kCmd, "--max-rows-per-s must be a positive number of rows per second");
  }
  auto spec = market::BuildModelSpec(o);
  if (!spec.ok()) return Fail(kCmd, spec.status());
  auto store = market::Store::Open(db);
  if (!store.ok()) return Fail(kCmd, store.status());
  if (Status s = (*store)->AddModel(*spec, replace, market::UnixNow()); !s.ok()) {
    return Fail(kCmd, s);
  }
  std::printf(
      "model %s (%s): %d layers, ctx %d, %zu ring(s) of %zu windows, credit for at most "
      "%.0f rows/s per ring\n",
      spec->name.c_str(), spec->model_id.c_str(), spec->n_layer, spec->ctx, spec->rings.size(),
      spec->rings[0].size(), spec->max_rows_per_s);
  std::printf("%-7s %-9s %12s %12s %8s\n", "window", "layers", "weights", "memory", "tensors");
  for (size_t w = 0; w < spec->rings[0].size(); ++w) {
    const auto& win = spec->rings[0][w];
    std::printf("%-7zu %-9s %12s %12s %8zu\n", w, fmt::format("{}:{}", win.first, win.last).c_str(),
                HumanBytes(win.bytes).c_str(), HumanBytes(win.memory).c_str(), win.tensors.size());
  }
  return kExitOk;
}

int Balances(int argc, char** argv) {
  CLI::App app{"Print who earned what, with the receipts behind it.", "kvasir market balances"};
  std::string db, node;
  bool json = false;
  app.add_option("--db", db, "market database: a SQLite file, or postgresql://...")->required();
  app.add_option("--node", node, "only this node's receipts (64 hex digits)");
  app.add_flag("--json", json, "print JSON (as GET /v1/balances)");
  if (auto code = ParseArgs(app, "market balances", argc, argv)) return *code;
  if (!market::Db::IsPostgresUrl(db) && !std::filesystem::exists(db)) {
    return UsageError(kCmd, "--db: " + db + ": no such file");
  }
  if (!node.empty()) {
    auto key = ring::ParsePublicKey(node);
    if (!key.ok()) return UsageError(kCmd, "--node: " + key.status().message());
    node = ring::PublicKeyHex(*key);
  }
  auto store = market::Store::Open(db);
  if (!store.ok()) return Fail(kCmd, store.status());
  auto balances = (*store)->Balances();
  if (!balances.ok()) return Fail(kCmd, balances.status());
  auto receipts = (*store)->Receipts(node, 20);
  if (!receipts.ok()) return Fail(kCmd, receipts.status());
  if (json) {
    market::MarketApi api(store->get(), {});
    std::printf(
        "%s\n",
        api.Handle({"GET", node.empty() ? "/v1/balances" : "/v1/balances?node=" + node, {}, "", ""},
                   market::UnixNow())
            .body.c_str());
    return kExitOk;
  }
  std::printf("%-16s %14s %12s %9s\n", "node", "credit", "work", "receipts");
  for (const auto& b : *balances) {
    if (!node.empty() && b.node != node) continue;
    std::printf("%-16s %14.3f %12llu %9lld\n", b.node.substr(0, 16).c_str(), b.credit,
                static_cast<unsigned long long>(b.work), static_cast<long long>(b.receipts));
  }
  std::printf("\n%s receipts:\n", node.empty() ? "latest" : "this node's");
  std::printf("%-16s %-16s %4s %7s  %s\n", "receipt", "model", "ring", "tokens",
              "signers (layers)");
  for (const auto& r : *receipts) {
    std::string signers;
    for (const auto& l : r.lines) {
      signers += fmt::format("{}{} ({}:{})", signers.empty() ? "" : " -> ", l.node.substr(0, 8),
                             l.first, l.last);
    }
    std::printf("%-16s %-16s %4d %7llu  %s\n", r.id.substr(0, 16).c_str(), r.model.c_str(), r.ring,
                static_cast<unsigned long long>(r.tokens), signers.c_str());
  }
  return kExitOk;
}

int Serve(int argc, char** argv) {
  CLI::App app{"Serve the market: the coverage/demand map, claims, receipts and the live page.",
               "kvasir market"};
  std::string db, relay_secret_file, log_level = "info";
  market::MarketServerOptions so;
  market::MarketConfig config;
  app.add_option("--db", db,
                 "market database: a SQLite file (created when missing), or postgresql://...")
      ->required();
  app.add_option("--listen", so.listen, "HOST:PORT to serve on")->capture_default_str();
  app.add_option("--relay", config.relay_url,
                 "ws[s]://HOST[:PORT] of the relay nodes behind NAT are given");
  app.add_option("--relay-secret-file", relay_secret_file,
                 "the relay's secret: nodes get the edge tokens of their own edges")
      ->check(CLI::ExistingFile);
  market::CheckerOptions checker_options;
  app.add_option("--relay-ca", checker_options.relay_ca_file,
                 "PEM certificates to trust for the wss:// relay when the market dials a standby "
                 "behind NAT through it (default: the system's)")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-cert", so.tls_cert, "PEM certificate chain (with --tls-key): serve HTTPS")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", so.tls_key, "PEM private key of the certificate")
      ->check(CLI::ExistingFile);
  app.add_option("--lease", config.lease_s, "seconds a claim lasts without a heartbeat")
      ->capture_default_str();
  app.add_option("--lease-flush", config.lease_flush_s,
                 "seconds a renewal may wait in memory before it is written with the others "
                 "(0: each at once)")
      ->capture_default_str();
  app.add_option("--verify-threads", so.verify_threads,
                 "threads that check the signatures of signed requests beside the one that "
                 "answers them (0: that one checks them too)")
      ->capture_default_str();
  app.add_option("--clock-skew", config.clock_skew_s,
                 "seconds a signed request's time may differ from the market's")
      ->capture_default_str();
  double floor_mb_per_s = config.eviction.floor_bytes_per_s / 1e6;
  app.add_option("--serve-deadline", config.eviction.deadline_s,
                 "seconds a claim has to prove its bytes, and a complete ring's holders to serve, "
                 "before they are evicted (plus the window's download time at --floor-bandwidth)")
      ->capture_default_str();
  app.add_option("--floor-bandwidth", floor_mb_per_s,
                 "MB/s: the slowest download the serve deadline allows for")
      ->capture_default_str();
  app.add_option("--cooldown", config.eviction.cooldown_s,
                 "seconds an evicted key waits before it may claim again (doubled each eviction)")
      ->capture_default_str();
  config.audit.rate = market::kDefaultAuditRate;
  app.add_option("--audit-rate", config.audit.rate,
                 "fraction of credited sessions whose holders must reveal rows (0 to 1)")
      ->capture_default_str();
  config.audit.prefix = market::kDefaultAuditPrefix;
  app.add_option("--audit-prefix", config.audit.prefix,
                 "the first positions of an audited session its holders reveal too, for "
                 "`kvasir audit` to recompute (0 to 56)")
      ->capture_default_str();
  app.add_option("--audit-ban", config.audit.ban_s,
                 "seconds a node that fails an audit may not claim (doubled each offence)")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "debug, info, warn, error")->capture_default_str();
  if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
  if (Status s = ApplyLogLevel(log_level); !s.ok()) return UsageError(kCmd, s.message());
  if (!(config.audit.rate >= 0 && config.audit.rate <= 1)) {
    return UsageError(kCmd, "--audit-rate must be from 0 to 1");
  }
  if (config.audit.prefix < 0 || config.audit.prefix > market::kMaxAuditPrefix) {
    return UsageError(kCmd, "--audit-prefix must be from 0 to 56 positions");
  }
  if (!(config.audit.ban_s >= 0 && config.audit.ban_s <= 86400)) {
    return UsageError(kCmd, "--audit-ban must be from 0 to 86400 seconds");
  }
  if (!(config.eviction.deadline_s >= 1 && config.eviction.deadline_s <= 86400)) {
    return UsageError(kCmd, "--serve-deadline must be from 1 to 86400 seconds");
  }
  if (!(floor_mb_per_s >= 0.01 && floor_mb_per_s <= 1e6)) {
    return UsageError(kCmd, "--floor-bandwidth must be from 0.01 to 1000000 MB/s");
  }
  config.eviction.floor_bytes_per_s = floor_mb_per_s * 1e6;
  if (!(config.eviction.cooldown_s >= 0 &&
        config.eviction.cooldown_s <= market::kMaxCooldownSeconds)) {
    return UsageError(kCmd, "--cooldown must be from 0 to 86400 seconds");
  }
  if (config.lease_s < 3 || config.lease_s > 3600) {
    return UsageError(kCmd, "--lease must be from 3 to 3600 seconds");
  }
  if (!(config.lease_flush_s >= 0 && config.lease_flush_s <= config.lease_s / 3)) {
    return UsageError(kCmd, "--lease-flush must be from 0 to a third of --lease");
  }
  if (so.verify_threads < 0 || so.verify_threads > 64) {
    return UsageError(kCmd, "--verify-threads must be from 0 to 64");
  }
  if (config.clock_skew_s < 5 || config.clock_skew_s > 3600) {
    return UsageError(kCmd, "--clock-skew must be from 5 to 3600 seconds");
  }
  while (!config.relay_url.empty() && config.relay_url.back() == '/') config.relay_url.pop_back();
  if (!config.relay_url.empty()) {
    auto u = net::ParseWebSocketUrl(config.relay_url);
    if (!u.ok() || u->target != "/") {
      return UsageError(kCmd, "--relay: ws[s]://HOST[:PORT] without a path");
    }
  }
  if (!relay_secret_file.empty()) {
    if (config.relay_url.empty()) return UsageError(kCmd, "--relay-secret-file needs --relay");
    auto secret = relay::ReadSecretFile(relay_secret_file);
    if (!secret.ok()) return Fail(kCmd, secret.status());
    config.relay_secret = *secret;
  } else if (!config.relay_url.empty()) {
    KV_LOG_WARN(
        "no --relay-secret-file: nodes get zero edge tokens, which only a relay without "
        "--secret-file accepts");
  }
  const sigset_t set = node::BlockStopSignals();
  auto store = market::Store::Open(db);
  if (!store.ok()) return Fail(kCmd, store.status());
  // The time the market was down is a silence: no lease ran out for it (docs/MARKET.md, "Grace").
  if (Status s = (*store)->Resume(market::UnixNow()); !s.ok()) return Fail(kCmd, s);
  if (!checker_options.relay_ca_file.empty() && config.relay_url.empty()) {
    return UsageError(kCmd, "--relay-ca needs --relay");
  }
  auto checker = market::StartStoreChecker(db, checker_options);
  if (!checker.ok()) return Fail(kCmd, checker.status());
  market::MarketApi api(store->get(), config, checker->get());
  auto server = market::MarketServer::Start(so, &api);
  if (!server.ok()) return Fail(kCmd, server.status());
  std::string host;
  uint16_t port = 0;
  (void)net::ParseHostPort(so.listen, &host, &port);
  std::printf("market: listening on %s:%u\n", host.c_str(), (*server)->port());
  std::fflush(stdout);
  KV_LOG_INFO("market: database {}, lease {} s{}", (*store)->db_name(), config.lease_s,
              config.relay_url.empty() ? "" : ", relay " + config.relay_url);
  node::WaitForStopSignal(set, [&server, &checker] {
    const auto st = (*server)->stats();
    const auto ck = (*checker)->stats();
    KV_LOG_INFO(
        "market: {} connections, {} requests, {} refused; checks of holders: {} passed, "
        "{} failed, {} requests dropped",
        st.connections, st.requests, st.refused, ck.passed, ck.failed, ck.dropped);
  });
  KV_LOG_INFO("market: stopping");
  (*server)->Stop();
  (*checker)->Stop();
  return kExitOk;
}

}  // namespace

int MarketMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    if (argc >= 2 && std::string_view(argv[1]) == "add-model") return AddModel(argc - 1, argv + 1);
    if (argc >= 2 && std::string_view(argv[1]) == "balances") return Balances(argc - 1, argv + 1);
    return Serve(argc, argv);
  });
}

}  // namespace kvasir::cli
