// A local ring that supervises itself, as `kvasir serve -m MODEL [--stages N]` and `kvasir bench
// --stages` start it: one stage in this process for N = 1, else N `kvasir stage` processes on
// loopback with the flags `kvasir run` gives its stages (stage_process.h; an even split of the
// layers, a fresh ring secret and node keys, ports bound here and inherited). A stage process that
// exits is started again on the same port, after a pause that doubles with each exit (0.5 s up to
// 30 s, back to 0.5 s once it stayed up a minute); meanwhile serve's API answers 503.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "net/delay_proxy.h"
#include "net/stream.h"
#include "node/local_ring.h"
#include "ring/stage.h"
#include "spec/drafter.h"

namespace kvasir::node {

struct LocalRingPlan {
  std::string model_path;
  int n_stages = 1;
  int threads_per_stage = 1;
  std::vector<std::string> backends;    // one for all stages, or one per stage; empty: cpu
  std::string boundary = "f32";         // f32, f16 or bf16
  AttnType attn_type = AttnType::kF32;  // each stage's --attn-type
  int n_ctx = 0;
  int max_sessions = 64;   // each stage's --max-sessions
  int64_t cache_mb = 256;  // each stage's --cache-mb
  int64_t replay_mb = 64;  // each stage's --replay-mb
  std::string stage_log_level = "warn";
  bool trace_timing = false;  // the stages' --trace-timing
  int chunk = 0;              // the head's --chunk (0: the stage's default)
  // A delaying proxy on every link (stage i dials it, it forwards to stage i + 1); none: direct.
  std::optional<net::LinkShape> hops;
  // Speculation on the last stage: its options when it runs in this process, and its flags
  // (`kvasir stage --draft ...`) as a process; none: none. Checked by the caller.
  spec::DraftOptions draft;
  std::vector<std::string> draft_args;
};

class SupervisedRing {
 public:
  // Validates the plan against the model (its layer count), then starts the stages. `on_fatal`
  // runs (on another thread) if the in-process stage fails and cannot go on.
  static Result<std::unique_ptr<SupervisedRing>> Start(const LocalRingPlan& plan, int n_layer,
                                                       std::function<void()> on_fatal);
  ~SupervisedRing();
  SupervisedRing(const SupervisedRing&) = delete;
  SupervisedRing& operator=(const SupervisedRing&) = delete;

  // HOST:PORT of the head, and the ring secret clients prove.
  const std::string& head() const { return head_; }
  const std::string& secret() const { return secret_; }
  // Stops the stages (SIGTERM, then SIGKILL after 5 s) and the supervisor. Idempotent.
  void Stop();

 private:
  SupervisedRing() = default;
  std::vector<std::string> StageArgs(int i) const;
  // What stage i dials as its successor: stage i + 1, or the proxy in between.
  std::string NextAddress(int i) const;
  void Supervise();

  LocalRingPlan plan_;
  std::vector<std::pair<int, int>> windows_;
  std::vector<std::string> backends_;
  std::vector<net::Listener> listeners_;  // kept: a restarted stage inherits its port again
  std::vector<std::unique_ptr<net::DelayProxy>> proxies_;  // one per link with `hops`, else none
  LocalTrust trust_;
  std::string head_, secret_;
  // Processes (N > 1).
  std::vector<Child> children_;
  std::thread supervisor_;
  // In process (N = 1).
  std::unique_ptr<ring::Stage> stage_;
  std::thread stage_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
};

}  // namespace kvasir::node
