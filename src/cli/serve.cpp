// kvasir serve: the OpenAI-compatible HTTP API in front of a ring (docs/API.md). Three ways to
// start, each one command: a local ring it starts and supervises itself (-m MODEL [--stages N]),
// a running ring (--ring HOST:PORT with how to trust its head), or a ready ring the market names
// (--market URL --model NAME). SIGINT/SIGTERM stop it; SIGUSR1 logs its counters.
#include <fmt/format.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "base/log.h"
#include "base/secret_file.h"
#include "base/timing_trace.h"
#include "cli/backend_flag.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/draft_flags.h"
#include "cli/ring_options.h"
#include "market/market_client.h"
#include "model/arch/registry.h"
#include "net/stream.h"
#include "node/signals.h"
#include "node/supervised_ring.h"
#include "serve/api_server.h"
#include "tokenizer/chat_template.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "serve";

struct ServeFlags {
  std::string model;  // local: a GGUF file; --market: the model's name there
  int n_stages = 1;
  int threads_per_stage = 0;  // 0: the cores shared out among the stages
  std::vector<std::string> backends;
  AttnType attn_type = AttnType::kF32;
  std::string boundary = "f32";
  int n_ctx = 0;
  int64_t cache_mb = 256;                // the local ring's prompt cache, per stage
  int64_t replay_mb = kDefaultReplayMb;  // the local ring's --replay-mb, per stage
  std::string ring;                      // HOST:PORT of a running ring's head
  std::string manifest_path;
  TrustFlags trust;
  std::string market;
  std::string market_ca;
  double market_wait_s = 30;
  std::string vocab;  // a GGUF with the tokenizer (and chat template) for --ring/--market
  std::string model_name;
  std::string chat_template;
  std::string api_key_file;
  std::string max_body = "1MiB";
  double request_timeout_s = 30;
  double stats_interval_s = 1;
  std::string log_level = "info";
  std::string stage_log_level = "warn";
  bool trace_timing = false;
  int chunk = 0;     // the local ring's prompt rows per prefill chunk (0: the stages' default)
  DraftFlags draft;  // the local ring's last stage (-m)
  serve::ServeOptions serve;
};

// A ready ring of `name` on the market: its head's address and node key. Waits up to `wait_s`
// while the market says none is ready yet.
Result<std::pair<std::string, std::string>> FindMarketRing(const ServeFlags& f) {
  net::HttpRequestOptions http;
  http.ca_file = f.market_ca;
  KV_ASSIGN_OR_RETURN(market::MarketClient client,
                      market::MarketClient::Create(f.market, nullptr, http));
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(f.market_wait_s * 1000));
  std::string said;
  while (true) {
    auto ring = client.Get("/v1/rings/" + f.model);
    if (ring.ok()) {
      try {
        return std::pair{ring->at("head").at("address").get<std::string>(),
                         ring->at("head").at("node").get<std::string>()};
      } catch (const std::exception& e) {
        return Error("market {}: malformed ring answer: {}", f.market, e.what());
      }
    }
    if (ring.status().code() != StatusCode::kUnavailable ||
        std::chrono::steady_clock::now() >= deadline) {
      return ring.status();
    }
    if (ring.status().message() != said) {
      said = ring.status().message();
      KV_LOG_INFO("{}; waiting up to {:.0f} s (--market-wait)", said, f.market_wait_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

// The vocabulary and chat family of a GGUF header (the model, a slice, a vocabulary file).
Status LoadVocab(const std::string& path, const std::string& chat_template, serve::ServeOptions* o,
                 int* n_layer) {
  KV_ASSIGN_OR_RETURN(auto file, OpenGguf(path));
  KV_ASSIGN_OR_RETURN(auto tok, Tokenizer::FromGguf(file->header(), path));
  o->tokenizer = std::shared_ptr<const Tokenizer>(std::move(tok));
  if (n_layer != nullptr) {
    KV_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(*file));
    *n_layer = cfg.n_layer;
  }
  if (!chat_template.empty()) return Status::Ok();
  auto family = ChatFamilyForModel(file->header(), path, "");
  if (family.ok()) {
    o->chat_family = *family;
  } else {
    KV_LOG_WARN(
        "serve: {}; /v1/chat/completions is refused until a family is chosen with "
        "--chat-template NAME",
        family.status().message());
  }
  return Status::Ok();
}

std::optional<std::string> CheckFlags(const ServeFlags& f) {
  if (Status d = CheckDraftFlags(f.draft).status(); !d.ok()) return d.message();
  if (f.draft.kind != "none" && (f.model.empty() || !f.market.empty())) {
    return "--draft runs on a ring serve starts itself (-m MODEL); a running ring drafts if its "
           "last stage was started with --draft";
  }
  const int modes = (!f.ring.empty()) + (!f.market.empty());
  if (modes > 1) return "use one of -m MODEL, --ring HOST:PORT and --market URL";
  if (!f.ring.empty() && !f.model.empty()) {
    return "--ring serves a running ring: drop -m (give --vocab FILE for a vocabulary)";
  }
  if (!f.market.empty() && f.model.empty()) return "--market needs --model NAME";
  if (f.ring.empty() && f.market.empty() && f.model.empty()) {
    return "a model is required: -m MODEL (a local ring), --ring HOST:PORT or --market URL "
           "--model NAME";
  }
  const bool local = f.ring.empty() && f.market.empty();
  if (!local && (f.n_stages != 1 || !f.backends.empty() || f.n_ctx != 0 || f.chunk != 0 ||
                 f.replay_mb != kDefaultReplayMb || f.attn_type != AttnType::kF32)) {
    return "--stages, --backends, --attn-type, -c, --chunk and --replay-mb shape a local ring "
           "(-m MODEL); a running ring has its own";
  }
  if (Status r = CheckReplayMb(f.replay_mb); !r.ok()) return r.message();
  if (f.chunk < 0)
    return fmt::format("--chunk {} must be at least 1 (0: the stages' default)", f.chunk);
  if (local && !f.vocab.empty()) return "--vocab is for --ring and --market (-m has a vocabulary)";
  if (local && (!f.trust.ring_secret_file.empty() || !f.trust.head_key.empty() ||
                !f.trust.client_key_file.empty() || f.trust.insecure)) {
    return "the trust flags are for --ring and --market (a local ring makes its own secret)";
  }
  if (!f.market_ca.empty() && f.market.empty()) return "--ca goes with --market";
  if (!f.manifest_path.empty() && f.ring.empty()) return "--manifest goes with --ring";
  if (!f.chat_template.empty()) {
    if (auto fam = ChatFamilyFromName(f.chat_template); !fam.ok()) {
      return "--chat-template: " + fam.status().message();
    }
  }
  if (f.cache_mb < 0 || f.cache_mb > (int64_t{1} << 24)) {
    return fmt::format("--cache-mb {} must be from 0 to {}", f.cache_mb, int64_t{1} << 24);
  }
  if (f.serve.max_sessions < 1 || f.serve.max_sessions > 4096) {
    return fmt::format("--max-sessions {} must be from 1 to 4096", f.serve.max_sessions);
  }
  if (f.serve.max_waiting < 0 || f.serve.max_waiting > 65536) {
    return fmt::format("--max-waiting {} must be from 0 to 65536", f.serve.max_waiting);
  }
  if (!(f.request_timeout_s >= 0.1 && f.request_timeout_s <= 3600)) {
    return fmt::format("--request-timeout {} must be from 0.1 to 3600 seconds",
                       f.request_timeout_s);
  }
  if (!(f.stats_interval_s >= 0.01 && f.stats_interval_s <= 60)) {
    return fmt::format("--stats-interval {} must be from 0.01 to 60 seconds", f.stats_interval_s);
  }
  if (!(f.market_wait_s >= 0 && f.market_wait_s <= 86400)) {
    return "--market-wait must be from 0 to 86400 seconds";
  }
  if (f.threads_per_stage < 0) return "-t must be >= 1";
  if (f.serve.cors_origin.find_first_of("\r\n") != std::string::npos) {
    return "--cors-origin must be one line";
  }
  if (f.model_name.size() > 256) return "--model-name is longer than 256 bytes";
  return std::nullopt;
}

int Serve(ServeFlags f) {
  if (auto e = CheckFlags(f)) return UsageError(kCmd, *e);
  if (Status s = ApplyLogLevel(f.log_level); !s.ok()) return UsageError(kCmd, s.message());
  EnableTimingTrace(f.trace_timing);
  auto body = ParseByteSize(f.max_body);
  if (!body.ok() || *body < 1024 || *body > (uint64_t{64} << 20)) {
    return UsageError(kCmd,
                      fmt::format("--max-body '{}' must be a size from 1KiB to 64MiB", f.max_body));
  }
  f.serve.max_body_bytes = *body;
  f.serve.request_timeout_ms = static_cast<int>(f.request_timeout_s * 1000);
  const bool local = f.ring.empty() && f.market.empty();
  ring::ClientOptions client;
  if (!local) {
    Manifest m;
    if (!f.manifest_path.empty()) {
      auto loaded = LoadManifest(f.manifest_path);
      if (!loaded.ok()) return Fail(kCmd, loaded.status());
      m = std::move(loaded).value();
    }
    bool usage = false;
    if (!f.market.empty() && !f.trust.head_key.empty()) {
      return UsageError(kCmd, "--market names the head's key itself; drop --head-key");
    }
    if (Status s =
            ApplyClientTrust(f.trust, f.manifest_path.empty() ? nullptr : &m, &client, &usage);
        !s.ok()) {
      return usage ? UsageError(kCmd, s.message()) : Fail(kCmd, s);
    }
  }
  for (size_t i = 0; i < f.backends.size(); ++i) {
    if (auto code =
            CheckBackendFlag(kCmd, fmt::format("--backends (stage {})", i), f.backends[i])) {
      return *code;
    }
  }
  if (auto code = CheckAttnTypeFlag(kCmd, f.attn_type, f.backends)) return *code;
  if (!f.api_key_file.empty()) {
    auto key = ReadSecretFile(f.api_key_file, "API key");
    if (!key.ok()) return Fail(kCmd, key.status());
    f.serve.api_key = *key;
  }
  if (!f.chat_template.empty()) f.serve.chat_family = *ChatFamilyFromName(f.chat_template);
  int n_layer = 0;
  const std::string vocab = local ? f.model : f.vocab;
  if (!vocab.empty()) {
    if (Status s = LoadVocab(vocab, f.chat_template, &f.serve, local ? &n_layer : nullptr);
        !s.ok()) {
      return Fail(kCmd, s);
    }
  }
  if (f.model_name.empty()) {
    f.model_name = !f.market.empty() ? f.model
                   : !vocab.empty()  ? std::filesystem::path(vocab).stem().string()
                                     : "kvasir";
  }
  f.serve.model_name = f.model_name;

  const sigset_t set = node::BlockStopSignals();
  std::unique_ptr<node::SupervisedRing> local_ring;
  std::string head = f.ring;
  if (local) {
    node::LocalRingPlan plan;
    plan.model_path = f.model;
    plan.n_stages = f.n_stages;
    plan.threads_per_stage = f.threads_per_stage > 0
                                 ? f.threads_per_stage
                                 : std::max(1, DefaultThreads() / std::max(1, f.n_stages));
    plan.backends = f.backends;
    plan.attn_type = f.attn_type;
    plan.boundary = f.boundary;
    plan.n_ctx = f.n_ctx;
    // Every request is one session; the serve links and the watcher's add a few.
    plan.max_sessions = std::max(64, f.serve.max_sessions + 8);
    plan.cache_mb = f.cache_mb;
    plan.replay_mb = f.replay_mb;
    plan.stage_log_level = f.stage_log_level;
    plan.trace_timing = f.trace_timing;
    plan.chunk = f.chunk;
    auto draft_options = CheckDraftFlags(f.draft);
    if (!draft_options.ok()) return Fail(kCmd, draft_options.status());
    plan.draft = *draft_options;
    plan.draft_args = DraftStageArgs(f.draft);
    auto ring = node::SupervisedRing::Start(plan, n_layer, [] { kill(getpid(), SIGTERM); });
    if (!ring.ok()) return Fail(kCmd, ring.status());
    local_ring = std::move(ring).value();
    head = local_ring->head();
    client.ring_secret = local_ring->secret();
  } else if (!f.market.empty()) {
    auto found = FindMarketRing(f);
    if (!found.ok()) return Fail(kCmd, found.status());
    head = found->first;
    auto key = ring::ParsePublicKey(found->second);
    if (!key.ok()) return Fail(kCmd, key.status().WithContext("the market's head key"));
    client.head_key = *key;
    KV_LOG_INFO("market: serving the ring of {} whose head is {} at {}", f.model,
                found->second.substr(0, 8), head);
  }
  serve::RingAccessOptions ro;
  ro.head = head;
  ro.client = client;
  ro.max_idle = f.serve.max_sessions;
  ro.watch_interval_ms = static_cast<int>(f.stats_interval_s * 1000);
  auto access = serve::RingAccess::Start(ro);
  auto server = serve::ApiServer::Start(f.serve, access.get());
  if (!server.ok()) {
    access->Stop();
    if (local_ring) local_ring->Stop();
    return Fail(kCmd, server.status());
  }
  std::string host;
  uint16_t port = 0;
  (void)net::ParseHostPort(f.serve.listen, &host, &port);
  // The line scripts and tests wait for.
  std::fprintf(stderr, "serve: listening on %s:%u (model %s, ring %s)\n", host.c_str(),
               (*server)->port(), f.model_name.c_str(), head.c_str());
  std::fflush(stderr);
  node::WaitForStopSignal(set, [&server] {
    const serve::MetricsGauges g = (*server)->Gauges();
    KV_LOG_INFO("serve: ring {}, {} sessions busy, {} waiting", g.ring_up ? "up" : "down",
                g.sessions_busy, g.sessions_deferred);
  });
  KV_LOG_INFO("serve: stopping");
  access->Stop();  // requests in progress end now
  (*server)->Stop();
  if (local_ring) local_ring->Stop();
  return kExitOk;
}

}  // namespace

int ServeMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{
        "Serve the OpenAI-compatible HTTP API (completions, chat completions, models, "
        "health, metrics, tokenize) in front of a ring.",
        "kvasir serve"};
    ServeFlags f;
    app.add_option("-m,--model", f.model,
                   "GGUF model to run as a local ring (with --market: the name of a model the "
                   "market lists)");
    app.add_option("--stages", f.n_stages, "stages of the local ring (1: in this process)")
        ->capture_default_str();
    app.add_option("-t,--threads", f.threads_per_stage,
                   "threads per stage of the local ring (default: the cores shared out)");
    app.add_option("--backends", f.backends,
                   "where each stage of the local ring runs (one for all, or one per stage): " +
                       BackendSyntax())
        ->delimiter(',');
    AddAttnTypeFlag(app, &f.attn_type)
        ->description(
            "the local ring's attention operands: f32, or bf16 (keys, values, queries and weights "
            "rounded to bf16, f32 sums: faster over long contexts; needs AVX512-BF16)");
    app.add_option("--boundary", f.boundary, "hidden-state dtype between stages: f32, f16, bf16")
        ->capture_default_str();
    app.add_option("-c,--ctx-size", f.n_ctx, "context per session; 0 = the model's, at most 4096")
        ->capture_default_str();
    app.add_option("--chunk", f.chunk,
                   "prompt tokens per prefill chunk on the local ring's head (the new tokens are "
                   "cut into chunks of near-equal work, each at most this many tokens and, up "
                   "to 4 chunks, the work of this many fresh ones: a token after a cached "
                   "history also counts the positions it attends to; the stages pipeline the "
                   "chunks; 0: kvasir stage's default)")
        ->capture_default_str();
    app.add_option("--ring", f.ring, "serve a running ring: HOST:PORT of its head stage");
    app.add_option("--manifest", f.manifest_path,
                   "(with --ring) the ring's manifest: rank 0's node_key authenticates the head");
    AddClientTrustFlags(app, &f.trust);
    app.add_option("--market", f.market,
                   "http[s]://HOST[:PORT] of a market: serve a ready ring of --model there");
    app.add_option("--ca", f.market_ca, "(with --market) PEM certificates to trust for https://")
        ->check(CLI::ExistingFile);
    app.add_option("--market-wait", f.market_wait_s,
                   "(with --market) seconds to wait for a ring to be ready")
        ->capture_default_str();
    app.add_option("--vocab", f.vocab,
                   "(with --ring or --market) a GGUF holding the model's tokenizer (the model, a "
                   "slice, a vocabulary file): /tokenize, /detokenize and its chat template")
        ->check(CLI::ExistingFile);
    app.add_option("--model-name", f.model_name,
                   "the model's name in the API (default: the file's name, or the market's)");
    app.add_option(
        "--chat-template", f.chat_template,
        "chat format for /v1/chat/completions instead of the model's template: " + [] {
          std::string names;
          for (auto n : ChatFamilyNames()) names += (names.empty() ? "" : ", ") + std::string(n);
          return names;
        }());
    app.add_option("--listen", f.serve.listen, "HOST:PORT the API listens on")
        ->capture_default_str();
    app.add_option("--api-key-file", f.api_key_file,
                   "a file holding the API key (>= 16 bytes) clients must send as 'Authorization: "
                   "Bearer KEY'")
        ->check(CLI::ExistingFile);
    app.add_option("--cors-origin", f.serve.cors_origin,
                   "the origin browsers may call the API from ('*' for any)");
    app.add_option("--max-sessions", f.serve.max_sessions, "requests on the ring at once")
        ->capture_default_str();
    app.add_option("--cache-mb", f.cache_mb,
                   "the local ring's prompt cache: MiB per stage of ended requests' state, reused "
                   "by later prompts that start the same way (a chat's next turn); 0: off")
        ->capture_default_str();
    AddReplayFlag(app, &f.replay_mb);
    app.add_option("--max-waiting", f.serve.max_waiting,
                   "requests waiting for a place before more are refused (429)")
        ->capture_default_str();
    app.add_option("--max-body", f.max_body, "largest request body (413 beyond)")
        ->capture_default_str();
    app.add_option("--request-timeout", f.request_timeout_s,
                   "seconds to read a request, and to write each piece of an answer")
        ->capture_default_str();
    app.add_option("--stats-interval", f.stats_interval_s,
                   "seconds between the ring's statistics (its health, /metrics' stages)")
        ->capture_default_str();
    app.add_option("--log-level", f.log_level, "debug, info, warn, error")->capture_default_str();
    app.add_option("--stage-log-level", f.stage_log_level,
                   "log level of the local ring's stage processes")
        ->capture_default_str();
    app.add_flag("--trace-timing", f.trace_timing,
                 "write a timestamped line to stderr for each request's steps here and on the "
                 "local ring's stages (accepted, with the parse and template times; a link to the "
                 "head taken; the first token; the first text written), for "
                 "bench/trace_timing.py");
    AddDraftFlags(app, &f.draft);
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    return Serve(std::move(f));
  });
}

}  // namespace kvasir::cli
