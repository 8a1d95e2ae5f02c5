// kvasir stage: run one window of a model as a ring stage. SIGINT/SIGTERM stop it cleanly;
// SIGUSR1 logs its statistics.
#include <fmt/format.h>
#include <signal.h>

#include <thread>

#include "base/log.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/ring_options.h"
#include "ring/stage.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "stage";

int RunStage(const ring::StageOptions& opt) {
  // Signals are taken by one thread with sigwait(), so no handler runs inside the stage's code.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  auto stage = ring::Stage::Create(opt);
  if (!stage.ok()) return Fail(kCmd, stage.status());
  ring::Stage* s = stage->get();
  std::thread signals([s, set] {
    while (true) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) return;
      if (sig == SIGUSR1) {
        s->LogStats();
        continue;
      }
      KV_LOG_INFO("{}: stopping", sig == SIGINT ? "interrupt" : "terminate");
      s->Stop();
      return;
    }
  });
  Status st = s->Run();
  s->Stop();
  // Wake the signal thread if Run() ended on its own.
  pthread_kill(signals.native_handle(), SIGTERM);
  signals.join();
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
    app.add_option("-m,--model", opt.model_path, "GGUF model file (full model or stage slice)")
        ->required();
    app.add_option("--layers", layers, "window of layers A:B (A included, B excluded)")
        ->required();
    app.add_option("--listen", opt.listen, "HOST:PORT to accept the predecessor and clients")
        ->required();
    app.add_option("--next", opt.next, "HOST:PORT of the successor stage")->required();
    app.add_option("--name", opt.name, "name in logs and stats (default stage-A-B)");
    app.add_option("-t,--threads", opt.n_threads, "compute threads")->capture_default_str();
    app.add_option("-c,--ctx-size", opt.n_ctx, "KV capacity per session; 0 = model's, max 4096")
        ->capture_default_str();
    app.add_option("--boundary", boundary, "dtype of hidden states sent on: f32, f16, bf16")
        ->capture_default_str();
    app.add_option("--chunk", opt.chunk, "prompt tokens per prefill batch")->capture_default_str();
    app.add_option("--max-sessions", opt.max_sessions, "concurrent sessions")
        ->capture_default_str();
    app.add_option("--log-level", log_level, "debug, info, warn, error")->capture_default_str();
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (Status s = ParseLayers(layers, &opt.first, &opt.last); !s.ok()) {
      return UsageError(kCmd, s.message());
    }
    if (Status s = ParseBoundary(boundary, &opt.boundary); !s.ok()) {
      return UsageError(kCmd, s.message());
    }
    if (Status s = ApplyLogLevel(log_level); !s.ok()) return UsageError(kCmd, s.message());
    if (opt.n_threads < 1) return UsageError(kCmd, "-t must be >= 1");
    return RunStage(opt);
  });
}

}  // namespace kvasir::cli
