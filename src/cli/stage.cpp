// kvasir stage: run one window of a model as a ring stage. SIGINT/SIGTERM stop it cleanly;
// SIGUSR1 logs its statistics.
#include "ring/stage.h"

#include <fmt/format.h>

#include "base/log.h"
#include "base/timing_trace.h"
#include "cli/backend_flag.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/draft_flags.h"
#include "cli/fetch_cli.h"
#include "cli/ring_options.h"
#include "net/url.h"
#include "node/relay_dial.h"
#include "node/signals.h"
#include "node/slice_cache.h"
#include "ring/stage.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "stage";

int RunStage(const ring::StageOptions& opt) {
  const sigset_t set = node::BlockStopSignals();
  auto stage = ring::Stage::Create(opt);
  if (!stage.ok()) return Fail(kCmd, stage.status());
  ring::Stage* s = stage->get();
  Status st = node::RunUntilSignal(
      set, [s] { return s->Run(); },
      [s](int sig) {
        KV_LOG_INFO("{}: stopping", node::StopSignalName(sig));
        s->Stop();
      },
      [s] { s->LogStats(); });
  s->Stop();
  if (!st.ok()) return Fail(kCmd, st);
  return kExitOk;
}

}  // namespace

int StageMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{"Run one window of a model's layers as a stage of a ring.", "kvasir stage"};
    ring::StageOptions opt;
    opt.n_threads = DefaultThreads();
    std::string layers, boundary = "f32", log_level = "info";
    std::string manifest_path, fetch_url, slice_dir;
    int rank = -1;
    FetchFlags fetch_flags;
    app.add_option("-m,--model", opt.model_path,
                   "GGUF model file (full model or stage slice); with --fetch, where the slice "
                   "is kept");
    auto* fetch_opt = app.add_option(
        "--fetch", fetch_url,
        "URL of the model: fetch this stage's window over HTTP(S) range requests (or reuse a "
        "verified slice fetched before), then run it");
    app.add_option("--slice-dir", slice_dir,
                   "directory for fetched slices when -m is not given (default: "
                   "$KVASIR_CACHE_DIR, $XDG_CACHE_HOME/kvasir or ~/.cache/kvasir)")
        ->needs(fetch_opt);
    auto* layers_opt =
        app.add_option("--layers", layers, "window of layers A:B (A included, B excluded)");
    auto* manifest_opt = app.add_option("--manifest", manifest_path,
                                        "rank manifest from `kvasir plan` (with --rank)");
    app.add_option("--rank", rank, "this stage's rank in the manifest")->needs(manifest_opt);
    manifest_opt->excludes(layers_opt);
    auto* listen_opt =
        app.add_option("--listen", opt.listen, "HOST:PORT to accept the predecessor and clients");
    app.add_option("--listen-fd", opt.listen_fd,
                   "accept on this inherited, already listening socket instead of binding "
                   "--listen (from a supervisor such as `kvasir run`)")
        ->excludes(listen_opt)
        ->check(CLI::NonNegativeNumber);
    std::string pred_via, next_via, relay_secret_file;
    auto* next_opt =
        app.add_option("--next", opt.next, "HOST:PORT of the successor stage (or --next-via)");
    app.add_option("--pred-via", pred_via,
                   "ws[s]://RELAY/edge/ID: take the predecessor link through a relay (the "
                   "listener still accepts clients)");
    auto* next_via_opt =
        app.add_option("--next-via", next_via,
                       "ws[s]://RELAY/edge/ID: reach the successor through a relay instead of "
                       "--next")
            ->excludes(next_opt);
    app.add_option("--relay-secret-file", relay_secret_file,
                   "ring secret shared with the relay (edge tokens are made with it)")
        ->check(CLI::ExistingFile);
    app.add_option("--name", opt.name, "name in logs and stats (default stage-A-B)");
    app.add_option("--standby-peers", opt.standby_peers,
                   "HOST:PORT,...: standbys for the successor's window, dialed in turn after "
                   "--next when the successor is gone")
        ->delimiter(',')
        ->excludes(next_via_opt);
    app.add_flag("--standby", opt.standby,
                 "a hot standby: load the window and listen, and dial the successor only once a "
                 "predecessor links to it in place of a stage that died (not for layer 0)");
    double repair_timeout_s = opt.repair_timeout_ms / 1000.0;
    app.add_option("--repair-timeout", repair_timeout_s,
                   "seconds to hold the sessions crossing a link that went down, for the ring "
                   "to be repaired and the sessions replayed (0: end them at once)")
        ->capture_default_str();
    int64_t replay_mb = static_cast<int64_t>(opt.replay_bytes >> 20);
    AddReplayFlag(app, &replay_mb)
        ->description(
            "MiB of the rows sent on for live sessions, kept so that a replay after a repair "
            "sends them again instead of recomputing them (0: a replay recomputes every "
            "position)");
    app.add_option("-t,--threads", opt.n_threads, "compute threads")->capture_default_str();
    CLI::Option* backend_opt = AddBackendFlag(app, &opt.backend);
    backend_opt->description(backend_opt->get_description() +
                             "; with --manifest, the rank's backend unless given");
    AddAttnTypeFlag(app, &opt.attn_type);
    app.add_option("-c,--ctx-size", opt.n_ctx, "KV capacity per session; 0 = model's, max 4096")
        ->capture_default_str();
    app.add_option("--boundary", boundary, "dtype of hidden states sent on: f32, f16, bf16")
        ->capture_default_str();
    app.add_option("--chunk", opt.chunk,
                   "prompt tokens per prefill chunk on the head: at most this "
                   "many, and, up to 4 chunks, at most their work fresh (a token after a cached "
                   "history also counts the positions it attends to)")
        ->capture_default_str();
    app.add_option("--max-sessions", opt.max_sessions, "concurrent sessions")
        ->capture_default_str();
    app.add_option("--max-clients", opt.max_clients, "client connections the head serves at once")
        ->capture_default_str();
    int64_t cache_mb = static_cast<int64_t>(opt.cache_bytes >> 20);
    app.add_option("--cache-mb", cache_mb,
                   "prompt cache: MiB of ended sessions' state kept for later prompts that start "
                   "the same way (0: off)")
        ->capture_default_str();
    int cache_ttl_s = opt.cache_ttl_ms / 1000;
    app.add_option("--cache-ttl", cache_ttl_s, "prompt cache: seconds an ended session is kept")
        ->capture_default_str();
    app.add_option("--log-level", log_level, "debug, info, warn, error")->capture_default_str();
    bool trace_timing = false;
    app.add_flag("--trace-timing", trace_timing,
                 "write a timestamped line to stderr for each session's steps (opened, rows "
                 "received, computed, sent, sampled), for bench/trace_timing.py");
    DraftFlags draft_flags;  // used by the last stage only
    AddDraftFlags(app, &draft_flags);
    TrustFlags trust;
    AddStageTrustFlags(app, &trust);
    RevealFlags reveal;
    reveal.mib = 0;  // a stage of its own ring keeps none unless asked: no market audits it
    AddRevealFlags(app, &reveal);
    AddFetchFlags(app, &fetch_flags);
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (Status s = ApplyLogLevel(log_level); !s.ok()) return UsageError(kCmd, s.message());
    EnableTimingTrace(trace_timing);
    if (opt.listen.empty() && opt.listen_fd < 0) {
      return UsageError(kCmd, "--listen HOST:PORT (or --listen-fd N) is required");
    }
    if (opt.next.empty() && next_via.empty()) {
      return UsageError(kCmd, "--next HOST:PORT or --next-via URL is required");
    }
    node::RelayEdges edges{pred_via, next_via, relay_secret_file, fetch_flags.ca_file};
    if (Status e = node::CheckRelayEdges(edges); !e.ok()) return UsageError(kCmd, e.message());
    if (!relay_secret_file.empty() && pred_via.empty() && next_via.empty()) {
      return UsageError(kCmd, "--relay-secret-file needs --pred-via or --next-via");
    }
    // One secret serves both: the relay's edge tokens and the links' handshakes.
    if (edges.secret_file.empty()) edges.secret_file = trust.ring_secret_file;
    if (auto d = CheckDraftFlags(draft_flags); d.ok()) {
      opt.draft = *d;
    } else {
      return UsageError(kCmd, d.status().message());
    }
    if (opt.max_clients < 1) return UsageError(kCmd, "--max-clients must be >= 1");
    if (!(repair_timeout_s >= 0 && repair_timeout_s <= 3600)) {
      return UsageError(kCmd, fmt::format("--repair-timeout {} must be from 0 to 3600 seconds",
                                          repair_timeout_s));
    }
    opt.repair_timeout_ms = static_cast<int>(repair_timeout_s * 1000);
    if (Status r = CheckReplayMb(replay_mb); !r.ok()) return UsageError(kCmd, r.message());
    opt.replay_bytes = static_cast<size_t>(replay_mb) << 20;
    if (opt.max_sessions < 1) return UsageError(kCmd, "--max-sessions must be >= 1");
    if (cache_mb < 0 || cache_mb > (int64_t{1} << 24)) {
      return UsageError(
          kCmd, fmt::format("--cache-mb {} must be from 0 to {}", cache_mb, int64_t{1} << 24));
    }
    if (cache_ttl_s < 1 || cache_ttl_s > 86400) {
      return UsageError(kCmd, fmt::format("--cache-ttl {} must be from 1 to 86400", cache_ttl_s));
    }
    opt.cache_bytes = static_cast<uint64_t>(cache_mb) << 20;
    opt.cache_ttl_ms = cache_ttl_s * 1000;
    if (auto r = ApplyRevealFlags(reveal); r.ok()) {
      opt.row_store = std::make_shared<ring::RowStore>(*r);
      opt.test_fault_noise = reveal.test_fault_noise;
    } else {
      return UsageError(kCmd, r.status().message());
    }
    if (opt.n_threads < 1) return UsageError(kCmd, "-t must be >= 1");
    if (const int hw = DefaultThreads(); opt.n_threads > hw) {
      return UsageError(
          kCmd, fmt::format("-t {}: this machine runs {} threads at once", opt.n_threads, hw));
    }
    if (Status s = node::ApplyRelayEdges(edges, &opt); !s.ok()) return Fail(kCmd, s);
    FetchOptions fetch;
    if (Status s = ApplyFetchFlags(fetch_flags, &fetch); !s.ok()) {
      return UsageError(kCmd, s.message());
    }
    if (!fetch_url.empty()) {
      if (auto u = net::ParseUrl(fetch_url); !u.ok()) return UsageError(kCmd, u.status().message());
    }
    Manifest m;
    if (!manifest_path.empty()) {
      bool usage = false;
      auto r = ManifestRankFor(manifest_path, rank, &m, &usage);
      if (!r.ok()) return usage ? UsageError(kCmd, r.status().message()) : Fail(kCmd, r.status());
      // A manifest whose model is a URL means: fetch this rank's window unless -m names a file.
      if (fetch_url.empty() && opt.model_path.empty() && net::LooksLikeUrl(m.model)) {
        fetch_url = m.model;
      }
      if (fetch_url.empty()) {
        auto checked = LoadManifestFor(manifest_path, &opt.model_path);
        if (!checked.ok()) return Fail(kCmd, checked.status());
      }
      ApplyManifestRank(m, *r, &fetch);
      if (backend_opt->count() == 0) opt.backend = r->backend;
      opt.first = r->first;
      opt.last = r->last;
      if (opt.name.empty()) opt.name = r->device;
      if (opt.n_ctx == 0) opt.n_ctx = m.ctx;
    } else {
      if (opt.model_path.empty() && fetch_url.empty()) {
        return UsageError(kCmd, "-m MODEL, --fetch URL or --manifest is required");
      }
      if (layers.empty()) return UsageError(kCmd, "--layers A:B (or --manifest) is required");
      if (Status s = ParseLayers(layers, &opt.first, &opt.last); !s.ok()) {
        return UsageError(kCmd, s.message());
      }
    }
    // Before any download: a backend this machine cannot run makes the window useless.
    if (auto code = CheckBackendFlag(kCmd,
                                     backend_opt->count() == 0 && !manifest_path.empty()
                                         ? "the manifest's rank"
                                         : "--backend",
                                     opt.backend)) {
      return *code;
    }
    if (auto code = CheckAttnTypeFlag(kCmd, opt.attn_type, {opt.backend})) return *code;
    if (Status s = ring::ParseBoundary(boundary, &opt.boundary); !s.ok()) {
      return UsageError(kCmd, s.message());
    }
    bool usage = false;
    if (Status s = ApplyStageTrust(trust, manifest_path.empty() ? nullptr : &m, rank, &opt, &usage);
        !s.ok()) {
      return usage ? UsageError(kCmd, s.message()) : Fail(kCmd, s);
    }
    // Every option is checked before the slice is fetched: a typo must not cost a download.
    // (Exit 1, as when the stage refuses them at start.)
    if (Status c = ring::CheckStageOptions(opt); !c.ok()) return Fail(kCmd, c);
    if (!fetch_url.empty()) {
      fetch.url = fetch_url;
      fetch.first = opt.first;
      fetch.last = opt.last;
      if (opt.model_path.empty()) {
        opt.model_path = node::SlicePathFor(slice_dir.empty() ? node::DefaultSliceDir() : slice_dir,
                                            fetch_url, opt.first, opt.last);
      }
      fetch.out_path = opt.model_path;
      if (Status s = node::EnsureSlice(fetch); !s.ok()) return Fail(kCmd, s);
    }
    return RunStage(opt);
  });
}

}  // namespace kvasir::cli
