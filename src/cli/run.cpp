// kvasir run: the one-command local ring. Spawns N `kvasir stage` processes on 127.0.0.1 with an
// even split of the layers, waits for the ring to close, streams the answer, prints a per-stage
// table, and tears the ring down. With --relay every link goes through a local `kvasir relay`.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "base/log.h"
#include "base/secret_file.h"
#include "cli/backend_flag.h"
#include "cli/chat_prompt.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/draft_flags.h"
#include "cli/grammar_flags.h"
#include "cli/hop_delay.h"
#include "cli/ring_cli.h"
#include "cli/ring_options.h"
#include "model/arch/registry.h"
#include "net/stream.h"
#include "net/url.h"
#include "node/local_ring.h"
#include "node/stage_process.h"
#include "planner/manifest.h"
#include "shard/fetch.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "run";

struct RunOptions {
  std::string model_path;
  int n_stages = 2;
  std::string manifest_path;  // windows and stage names from a rank manifest
  int threads_per_stage = 1;
  // --backends: one for every stage, or one per stage in ring order (default: the manifest's
  // ranks, else cpu).
  std::vector<std::string> backends;
  std::string boundary = "f32";
  AttnType attn_type = AttnType::kF32;  // each stage's --attn-type
  int n_ctx = 0;
  std::string stats_path;
  std::string stage_log_level = "error";
  RingRequest request;
  std::optional<uint64_t> seed;
  bool relay = false;                  // every link through a local `kvasir relay`
  ChatFlags chat;                      // -p as a user message in the model's chat template
  std::optional<net::LinkShape> hops;  // a delaying proxy on every link (--hop-*)
  GrammarFlags grammar;                // --grammar-file, --json-schema-file
  DraftFlags draft;                    // speculation on the last stage
  int standby = 0;                     // hot standbys per window after the head's (--standby)
  // Each stage's --replay-mb.
  int64_t replay_mb = kDefaultReplayMb;
};

// The local relay of `run --relay`: a `kvasir relay` process on a free loopback port, sharing the
// ring secret with the stages.
struct LocalRelay {
  pid_t pid = -1;
  uint16_t port = 0;
  int err_fd = -1;  // the relay's stderr, copied to ours by `drain`
  std::thread drain;
  std::atomic<bool> stop_drain{false};

  ~LocalRelay() {
    stop_drain.store(true);
    if (drain.joinable()) drain.join();
    if (err_fd >= 0) close(err_fd);
  }
};

// Starts the relay and waits (at most 10 s) for its "relay: listening on HOST:PORT" line.
Status StartRelay(const std::string& log_level, const std::string& secret_path, LocalRelay* r) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Error("cannot create a pipe: {}", std::strerror(errno));
  auto pid = node::Spawn({"kvasir", "relay", "--listen", "127.0.0.1:0", "--secret-file",
                          secret_path, "--log-level", log_level},
                         fds[1]);
  close(fds[1]);
  r->err_fd = fds[0];
  if (!pid.ok()) return pid.status();
  r->pid = *pid;
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  constexpr std::string_view kReady = "relay: listening on ";
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{r->err_fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(r->err_fd, buf, sizeof(buf));
    if (n <= 0) break;  // the relay exited
    text.append(buf, static_cast<size_t>(n));
    const size_t at = text.find(kReady);
    const size_t eol = at == std::string::npos ? at : text.find('\n', at);
    if (eol == std::string::npos) continue;
    const std::string line = text.substr(at + kReady.size(), eol - at - kReady.size());
    const size_t colon = line.find(':');
    const int port = colon == std::string::npos ? 0 : std::atoi(line.c_str() + colon + 1);
    if (port <= 0 || port > 65535) return Error("the relay said '{}'", OneLine(line, 200));
    r->port = static_cast<uint16_t>(port);
    // Whatever else it logged so far, without the line itself.
    std::fwrite(text.data(), 1, at, stderr);
    std::fwrite(text.data() + eol + 1, 1, text.size() - eol - 1, stderr);
    r->drain = std::thread([r] {
      // Until the relay exits (EOF), or the run ends with the relay still there.
      char b[4096];
      while (true) {
        pollfd p{r->err_fd, POLLIN, 0};
        const int ready = poll(&p, 1, 100);
        if (ready <= 0) {
          if (r->stop_drain.load()) return;
          continue;
        }
        const ssize_t m = read(r->err_fd, b, sizeof(b));
        if (m <= 0) return;
        std::fwrite(b, 1, static_cast<size_t>(m), stderr);
      }
    });
    return Status::Ok();
  }
  return Error("the relay did not start within 10 s{}{}", text.empty() ? "" : ": ",
               OneLine(text, 400));
}

// The model's header: the local file, or the header of a model given by URL (one ranged read).
Result<std::shared_ptr<const GgufFile>> OpenModelHeader(const std::string& path, bool remote) {
  if (!remote) return OpenGguf(path);
  KV_ASSIGN_OR_RETURN(RemoteHeader rh, ReadRemoteHeader(path, net::HttpOptions{}));
  KV_ASSIGN_OR_RETURN(GgufHeader header, ParseGgufHeader(rh.bytes, rh.file_size, rh.url));
  return std::make_shared<const GgufFile>(
      GgufFile::HeaderOnly(std::move(header), path, rh.file_size));
}

// One stage to spawn: its name, window and backend.
struct StagePlan {
  std::string name;
  int first = 0, last = 0;
  std::string backend = "cpu";
};

// Gives each stage its backend from --backends (one for all, or one each) and checks that every
// one can run here, before anything starts. Returns the exit code on a refusal.
std::optional<int> AssignBackends(const std::vector<std::string>& backends,
                                  std::vector<StagePlan>* plan) {
  const size_t n = plan->size();
  if (!backends.empty() && backends.size() != 1 && backends.size() != n) {
    return UsageError(kCmd, fmt::format("--backends lists {} backends for {} stages (give one for "
                                        "all, or one per stage)",
                                        backends.size(), n));
  }
  for (size_t i = 0; i < n; ++i) {
    std::string flag = fmt::format("manifest rank {}", i);
    if (!backends.empty()) {
      (*plan)[i].backend = backends.size() == 1 ? backends[0] : backends[i];
      flag = fmt::format("--backends (stage {})", i);
    }
    if (auto code = CheckBackendFlag(kCmd, flag, (*plan)[i].backend)) return code;
  }
  return std::nullopt;
}

int RunRing(RunOptions o) {
  std::vector<StagePlan> plan;
  Result<std::shared_ptr<const GgufFile>> file = Status::Error("not opened");
  // A model given by URL: every stage fetches its own window (or reuses one fetched before).
  bool remote = net::LooksLikeUrl(o.model_path);
  if (!o.manifest_path.empty()) {
    auto m = LoadManifest(o.manifest_path);
    if (!m.ok()) return Fail(kCmd, m.status());
    if (o.model_path.empty()) o.model_path = m->model;
    remote = net::LooksLikeUrl(o.model_path);
    if (!remote) {
      // A local file must be the model the manifest was planned for.
      if (auto checked = LoadManifestFor(o.manifest_path, &o.model_path); !checked.ok()) {
        return Fail(kCmd, checked.status());
      }
    }
    for (const ManifestRank& r : m->ranks) plan.push_back({r.device, r.first, r.last, r.backend});
    if (o.n_ctx == 0) o.n_ctx = m->ctx;
  } else {
    if (o.model_path.empty())
      return UsageError(kCmd, "a model is required: -m MODEL or --manifest");
    file = OpenModelHeader(o.model_path, remote);
    if (!file.ok()) return Fail(kCmd, file.status());
    auto cfg = LoadModelConfig(**file);
    if (!cfg.ok()) return Fail(kCmd, cfg.status());
    if (Status d = CheckDraftForModel(o.draft, *cfg); !d.ok()) return UsageError(kCmd, d.message());
    const int n_layer = cfg->n_layer;
    if (o.n_stages < 1 || o.n_stages > n_layer) {
      return UsageError(kCmd, fmt::format("--stages {} must be between 1 and the model's {} layers",
                                          o.n_stages, n_layer));
    }
    for (int i = 0; i < o.n_stages; ++i) {
      plan.push_back(
          {fmt::format("stage{}", i), i * n_layer / o.n_stages, (i + 1) * n_layer / o.n_stages});
    }
  }
  if (auto code = AssignBackends(o.backends, &plan)) return *code;
  std::vector<std::string> stage_backends;
  for (const StagePlan& p : plan) stage_backends.push_back(p.backend);
  if (auto code = CheckAttnTypeFlag(kCmd, o.attn_type, stage_backends)) return *code;
  if (o.chat.enabled()) {
    // The head tokenizes the text (BOS as the vocabulary asks, special tokens parsed), as
    // `generate` does locally.
    if (!file.ok()) file = OpenModelHeader(o.model_path, remote);
    if (!file.ok()) return Fail(kCmd, file.status());
    auto text = ChatPrompt(o.chat, (*file)->header(), o.model_path, o.request.prompt);
    if (!text.ok()) return Fail(kCmd, text.status());
    o.request.prompt = std::move(text).value();
  }
  // Stages that download first need longer than a local ring to come up; a stage that fails ends
  // the run anyway.
  if (remote) o.request.client.connect_timeout_ms = 3600 * 1000;
  const int n_stages = static_cast<int>(plan.size());
  wire::Dtype dtype;
  if (Status s = ring::ParseBoundary(o.boundary, &dtype); !s.ok()) {
    return UsageError(kCmd, s.message());
  }
  if (Status s = ApplyLogLevel(o.stage_log_level); !s.ok()) return UsageError(kCmd, s.message());
  SetLogLevel(LogLevel::kInfo);
  o.request.sampling.seed = o.seed ? *o.seed : std::random_device{}();

  // Window i (i >= 1) has o.standby spares, listening after the stages: spare k of window i on
  // listener n_stages + (i - 1) * o.standby + k.
  const int n_spares = n_stages > 1 ? (n_stages - 1) * o.standby : 0;
  auto spare_index = [&](int window, int k) { return n_stages + (window - 1) * o.standby + k; };
  auto listeners = node::BindLoopback(n_stages + n_spares);
  if (!listeners.ok()) return Fail(kCmd, listeners.status());
  std::vector<uint16_t> ports;
  for (const net::Listener& l : *listeners) ports.push_back(l.port());
  node::LocalTrust trust;  // outlives the children, which read its files
  if (Status s = node::MakeLocalTrust(&trust); !s.ok()) return Fail(kCmd, s);
  o.request.client.ring_secret = trust.secret;
  std::vector<node::Child> children;
  LocalRelay
      relay;  // declared after `children`: destroyed first, once node::StopAll() has ended it
  if (o.relay) {
    Status s = StartRelay(o.stage_log_level, trust.secret_path, &relay);
    if (relay.pid > 0) children.push_back({relay.pid, "relay"});
    if (!s.ok()) {
      node::StopAll(children);
      return Fail(kCmd, s);
    }
  }
  // With --hop-*, stage i dials a delaying proxy in this process that forwards to stage i + 1.
  std::vector<std::unique_ptr<net::DelayProxy>> proxies;
  if (o.hops) {
    auto started = node::StartHopProxies(ports, *o.hops);
    if (!started.ok()) {
      node::StopAll(children);
      return Fail(kCmd, started.status());
    }
    proxies = std::move(started).value();
  }
  // One relay edge per link: run-<our pid>-<from>-<to>.
  const auto edge = [&](int from, int to) {
    return fmt::format("ws://127.0.0.1:{}/edge/run-{}-{}-{}", relay.port, getpid(), from, to);
  };
  for (int slot = 0; slot < n_stages + n_spares; ++slot) {
    // A stage (slot < n_stages), or spare k of window i.
    const bool spare = slot >= n_stages;
    const int i = spare ? 1 + (slot - n_stages) / o.standby : slot;
    node::Child c;
    c.name = spare ? fmt::format("{}-standby{}", plan[i].name, (slot - n_stages) % o.standby)
                   : plan[i].name;
    std::vector<std::string> args = {"kvasir", "stage"};
    if (!remote) {
      args.insert(args.end(), {"-m", o.model_path});
    } else if (!o.manifest_path.empty()) {
      args.insert(args.end(), {"--fetch", o.model_path, "--manifest", o.manifest_path, "--rank",
                               std::to_string(i)});
    } else {
      args.insert(args.end(), {"--fetch", o.model_path});
    }
    if (o.manifest_path.empty() || !remote) {
      args.insert(args.end(), {"--layers", fmt::format("{}:{}", plan[i].first, plan[i].last)});
    }
    if (o.relay) {
      args.insert(args.end(), {"--pred-via", edge((i + n_stages - 1) % n_stages, i), "--next-via",
                               edge(i, (i + 1) % n_stages)});
    } else {
      args.insert(args.end(), {"--next", proxies.empty() ? fmt::format("127.0.0.1:{}",
                                                                       ports[(i + 1) % n_stages])
                                                         : proxies[i]->address()});
      // The successor's spares, for when it dies (docs/PROTOCOL.md, "Repair").
      if (const int next = (i + 1) % n_stages; next != 0 && o.standby > 0) {
        std::string peers;
        for (int k = 0; k < o.standby; ++k) {
          peers += fmt::format("{}127.0.0.1:{}", k == 0 ? "" : ",", ports[spare_index(next, k)]);
        }
        args.insert(args.end(), {"--standby-peers", peers});
      }
      if (spare) args.push_back("--standby");
    }
    // The listener goes to the stage; this process keeps no copy.
    net::Listener listener = std::move((*listeners)[slot]);
    const int listen_fd = listener.Release();
    node::StageProcessFlags flags;
    flags.listen_fd = listen_fd;
    flags.name = c.name;
    flags.threads = o.threads_per_stage;
    flags.backend = plan[i].backend;
    flags.boundary = o.boundary;
    flags.n_ctx = o.n_ctx;
    flags.log_level = o.stage_log_level;
    flags.secret_path = trust.secret_path;
    flags.key_path = trust.KeyPath(slot);
    flags.replay_mb = o.replay_mb;
    flags.attn_type = o.attn_type;
    node::AppendStageProcessArgs(flags, &args);
    if (i == n_stages - 1) {
      for (std::string& a : DraftStageArgs(o.draft)) args.push_back(std::move(a));
    }
    auto pid = node::Spawn(args, -1, listen_fd);
    ::close(listen_fd);
    if (!pid.ok()) {
      node::StopAll(children);
      return Fail(kCmd, pid.status());
    }
    c.pid = *pid;
    children.push_back(c);
  }
  KV_LOG_INFO("ring of {} stages{} started ({} threads each{}); waiting for it to close", n_stages,
              n_spares > 0 ? fmt::format(" and {} standbys", n_spares) : "", o.threads_per_stage,
              o.relay  ? fmt::format(", every link through the relay on port {}", relay.port)
              : o.hops ? ", " + HopText(o.hops)
                       : "");

  // A stage that dies ends the run: the watcher stops the others, which ends the client's wait.
  // With standbys only the head's death does: a spare takes any other stage's place.
  std::atomic<bool> done{false};
  std::string died;
  std::thread watcher([&] {
    while (!done.load()) {
      for (node::Child& c : children) {
        int status = 0;
        if (c.pid > 0 && waitpid(c.pid, &status, WNOHANG) == c.pid) {
          c.pid = -1;
          const std::string how = WIFEXITED(status) ? fmt::format("status {}", WEXITSTATUS(status))
                                                    : fmt::format("signal {}", WTERMSIG(status));
          if (o.standby > 0 && c.name != plan[0].name) {
            KV_LOG_WARN("{} exited ({}): a standby takes its place", c.name, how);
            continue;
          }
          died = fmt::format("{} exited ({})", c.name, how);
          done.store(true);
          node::StopAll(children);
          return;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  o.request.head = fmt::format("127.0.0.1:{}", ports[0]);
  auto run = RunRingRequest(o.request, /*with_stage_stats=*/true);
  done.store(true);
  watcher.join();
  node::StopAll(children);
  if (!died.empty()) return Fail(kCmd, "the ring broke: " + died);
  if (!run.ok()) return Fail(kCmd, run.status());
  PrintRingSummary(*run, o.threads_per_stage);
  std::map<int, std::string> devices;
  for (const StagePlan& p : plan) devices[p.first] = DeviceLabel(p.backend);
  PrintStageTable(run->stages, devices, run->repairs);
  PrintDraftSummary(*run);
  if (!o.stats_path.empty()) {
    if (Status s =
            WriteJsonFile(o.stats_path, RingStatsJson(o.model_path, *run, o.threads_per_stage));
        !s.ok()) {
      return Fail(kCmd, s);
    }
  }
  return kExitOk;
}

}  // namespace

int RunMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{"Run a model as a local ring of stage processes and generate text.", "kvasir run"};
    RunOptions o;
    SamplingParams& s = o.request.sampling;
    s.temperature = 0.8f;
    app.add_option("-m,--model", o.model_path,
                   "GGUF model file (with --manifest: default its model)");
    app.add_option("--manifest", o.manifest_path, "rank manifest from `kvasir plan`: its windows")
        ->excludes(app.add_option("--stages", o.n_stages, "number of stages (even split)"));
    AddGrammarFlags(app, &o.grammar);
    app.add_option("-p,--prompt", o.request.prompt, "prompt text (with --chat: the user's message)")
        ->required();
    AddChatFlags(app, &o.chat);
    app.add_option("-n,--n-predict", o.request.n_predict, "tokens to generate")
        ->capture_default_str();
    AddSamplingOptions(app, &s, &o.seed);
    app.add_option("--stop", o.request.stops, "stop when the text contains this (repeatable)");
    app.add_flag("--ignore-eos", o.request.ignore_eos, "keep generating after end tokens");
    o.threads_per_stage = std::max(1, DefaultThreads() / 2);
    app.add_option("-t,--threads", o.threads_per_stage, "threads per stage")->capture_default_str();
    app.add_option("--backends", o.backends,
                   "where each stage runs, in ring order, e.g. cpu,opencl,cpu (one value: every "
                   "stage; default: the manifest's ranks, else cpu): " +
                       BackendSyntax())
        ->delimiter(',');
    app.add_option("-c,--ctx-size", o.n_ctx, "context per session; 0 = model's, max 4096")
        ->capture_default_str();
    app.add_option("--boundary", o.boundary, "hidden-state dtype between stages: f32, f16, bf16")
        ->capture_default_str();
    AddAttnTypeFlag(app, &o.attn_type);
    app.add_option("--stats", o.stats_path, "write the summary and per-stage table as JSON");
    app.add_option("--stage-log-level", o.stage_log_level,
                   "log level of the stage (and relay) processes")
        ->capture_default_str();
    app.add_flag("--relay", o.relay,
                 "carry every link through a local `kvasir relay` (ws:// on loopback), as stages "
                 "behind NAT would through a public one");
    app.add_option("--standby", o.standby,
                   "hot standbys per window after the head's: each loads its window and takes "
                   "the place of a stage that dies, and the head replays the sessions")
        ->check(CLI::Range(0, 8))
        ->capture_default_str();
    AddReplayFlag(app, &o.replay_mb);
    HopFlags hop_flags;
    AddHopFlags(app, &hop_flags);
    AddDraftFlags(app, &o.draft);
    std::vector<char*> args = SpellChatAliases(argc, argv);
    if (auto code = ParseArgs(app, kCmd, argc, args.data())) return *code;
    auto hops = HopShape(hop_flags);
    if (!hops.ok()) return UsageError(kCmd, hops.status().message());
    if (*hops && o.relay) return UsageError(kCmd, "use either --relay or the --hop-* flags");
    if (o.standby > 0 && (o.relay || *hops)) {
      return UsageError(kCmd, "--standby works on direct links (not with --relay or --hop-*)");
    }
    o.hops = *hops;
    if (Status r = CheckReplayMb(o.replay_mb); !r.ok()) return UsageError(kCmd, r.message());
    if (std::string e = CheckChatFlags(o.chat); !e.empty()) return UsageError(kCmd, e);
    if (auto grammar = LoadGrammar(o.grammar); grammar.ok()) {
      o.request.grammar = std::move(grammar).value();
    } else {
      return UsageError(kCmd, grammar.status().message());
    }
    if (o.request.n_predict < 0) return UsageError(kCmd, "-n must be >= 0");
    if (auto e = CheckSampling(s)) return UsageError(kCmd, *e);
    if (o.threads_per_stage < 1) return UsageError(kCmd, "-t must be >= 1");
    if (Status d = CheckDraftFlags(o.draft).status(); !d.ok()) {
      return UsageError(kCmd, d.message());
    }
    return RunRing(std::move(o));
  });
}

}  // namespace kvasir::cli
