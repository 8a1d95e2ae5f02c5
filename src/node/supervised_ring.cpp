#include "node/supervised_ring.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <random>

#include "base/log.h"
#include "node/stage_process.h"
#include "ring/node_key.h"

namespace kvasir::node {
namespace {

using Clock = std::chrono::steady_clock;

std::string RandomHex(size_t bytes) {
  std::random_device rd;
  std::string out;
  for (size_t i = 0; i < bytes; ++i) out += fmt::format("{:02x}", rd() & 0xFF);
  return out;
}

std::string ExitText(int status) {
  return WIFEXITED(status) ? fmt::format("status {}", WEXITSTATUS(status))
                           : fmt::format("signal {}", WTERMSIG(status));
}

}  // namespace

Result<std::unique_ptr<SupervisedRing>> SupervisedRing::Start(const LocalRingPlan& plan,
                                                              int n_layer,
                                                              std::function<void()> on_fatal) {
  const int n = plan.n_stages;
  if (n < 1 || n > n_layer) {
    return Error("--stages {} must be between 1 and the model's {} layers", n, n_layer);
  }
  if (!plan.backends.empty() && plan.backends.size() != 1 &&
      plan.backends.size() != static_cast<size_t>(n)) {
    return Error("--backends lists {} backends for {} stages (give one for all, or one per stage)",
                 plan.backends.size(), n);
  }
  std::unique_ptr<SupervisedRing> r(new SupervisedRing());
  r->plan_ = plan;
  for (int i = 0; i < n; ++i) {
    r->windows_.emplace_back(i * n_layer / n, (i + 1) * n_layer / n);
    r->backends_.push_back(plan.backends.empty()       ? "cpu"
                           : plan.backends.size() == 1 ? plan.backends[0]
                                                       : plan.backends[i]);
  }
  KV_ASSIGN_OR_RETURN(r->listeners_, BindLoopback(n));
  r->head_ = fmt::format("127.0.0.1:{}", r->listeners_[0].port());
  if (plan.hops) {
    std::vector<uint16_t> ports;
    for (const net::Listener& l : r->listeners_) ports.push_back(l.port());
    KV_ASSIGN_OR_RETURN(r->proxies_, StartHopProxies(ports, *plan.hops));
  }
  if (n == 1) {
    // One stage, in this process: it holds every layer and is its own successor.
    ring::StageOptions o;
    o.model_path = plan.model_path;
    o.first = 0;
    o.last = n_layer;
    o.listen_fd = r->listeners_[0].Release();
    o.next = r->NextAddress(0);
    o.name = "stage0";
    o.n_threads = plan.threads_per_stage;
    o.backend = r->backends_[0];
    o.attn_type = plan.attn_type;
    o.n_ctx = plan.n_ctx;
    o.max_sessions = plan.max_sessions;
    o.cache_bytes = static_cast<uint64_t>(plan.cache_mb) << 20;
    o.replay_bytes = static_cast<size_t>(plan.replay_mb) << 20;
    KV_RETURN_IF_ERROR(ring::ParseBoundary(plan.boundary, &o.boundary));
    o.draft = plan.draft;
    o.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
    r->secret_ = RandomHex(32);
    o.ring_secret = r->secret_;
    KV_ASSIGN_OR_RETURN(r->stage_, ring::Stage::Create(o));
    r->stage_thread_ = std::thread([p = r.get(), on_fatal] {
      Status s = p->stage_->Run();
      bool stopping = false;
      {
        std::lock_guard<std::mutex> lock(p->mu_);
        stopping = p->stopping_;
      }
      if (!stopping) {
        KV_LOG_ERROR("local ring: the ring's stage ended: {}",
                     s.ok() ? "without an error" : s.message());
        if (on_fatal) on_fatal();
      }
    });
    return r;
  }
  KV_RETURN_IF_ERROR(MakeLocalTrust(&r->trust_));
  r->secret_ = r->trust_.secret;
  for (int i = 0; i < n; ++i) {
    auto pid = Spawn(r->StageArgs(i), -1, r->listeners_[i].fd());
    if (!pid.ok()) {
      StopAll(r->children_);
      return pid.status();
    }
    r->children_.push_back({*pid, fmt::format("stage{}", i)});
  }
  r->supervisor_ = std::thread([p = r.get()] { p->Supervise(); });
  return r;
}

std::string SupervisedRing::NextAddress(int i) const {
  if (!proxies_.empty()) return proxies_[i]->address();
  return fmt::format("127.0.0.1:{}", listeners_[(i + 1) % plan_.n_stages].port());
}

std::vector<std::string> SupervisedRing::StageArgs(int i) const {
  std::vector<std::string> args = {"kvasir",
                                   "stage",
                                   "-m",
                                   plan_.model_path,
                                   "--layers",
                                   fmt::format("{}:{}", windows_[i].first, windows_[i].second),
                                   "--next",
                                   NextAddress(i),
                                   "--max-sessions",
                                   std::to_string(plan_.max_sessions),
                                   "--cache-mb",
                                   std::to_string(plan_.cache_mb)};
  StageProcessFlags f;
  f.listen_fd = listeners_[i].fd();
  f.name = fmt::format("stage{}", i);
  f.threads = plan_.threads_per_stage;
  f.backend = backends_[i];
  f.boundary = plan_.boundary;
  f.n_ctx = plan_.n_ctx;
  f.log_level = plan_.stage_log_level;
  f.secret_path = trust_.secret_path;
  f.key_path = trust_.KeyPath(i);
  f.replay_mb = plan_.replay_mb;
  f.attn_type = plan_.attn_type;
  AppendStageProcessArgs(f, &args);
  if (plan_.trace_timing) args.push_back("--trace-timing");
  if (plan_.chunk > 0) {
    args.push_back("--chunk");
    args.push_back(std::to_string(plan_.chunk));
  }
  if (i == plan_.n_stages - 1)
    args.insert(args.end(), plan_.draft_args.begin(), plan_.draft_args.end());
  return args;
}

void SupervisedRing::Supervise() {
  const size_t n = children_.size();
  std::vector<Clock::time_point> started(n, Clock::now()), restart_at(n);
  std::vector<int> pause_ms(n, 500);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    for (size_t i = 0; i < n; ++i) {
      Child& c = children_[i];
      int status = 0;
      if (c.pid > 0 && waitpid(c.pid, &status, WNOHANG) == c.pid) {
        if (Clock::now() - started[i] > std::chrono::minutes(1)) pause_ms[i] = 500;
        KV_LOG_WARN("local ring: {} exited ({}); starting it again in {} ms", c.name,
                    ExitText(status), pause_ms[i]);
        c.pid = -1;
        restart_at[i] = Clock::now() + std::chrono::milliseconds(pause_ms[i]);
        pause_ms[i] = std::min(pause_ms[i] * 2, 30000);
      }
      if (c.pid < 0 && Clock::now() >= restart_at[i]) {
        auto pid = Spawn(StageArgs(static_cast<int>(i)), -1, listeners_[i].fd());
        if (pid.ok()) {
          c.pid = *pid;
          started[i] = Clock::now();
        } else {
          KV_LOG_WARN("local ring: cannot start {}: {}", c.name, pid.status().message());
          restart_at[i] = Clock::now() + std::chrono::milliseconds(pause_ms[i]);
        }
      }
    }
    // A child's exit is noticed within 100 ms (waitpid has no timeout to wait on).
    cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_; });
  }
}

void SupervisedRing::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (supervisor_.joinable()) supervisor_.join();
  StopAll(children_);
  if (stage_) stage_->Stop();
  if (stage_thread_.joinable()) stage_thread_.join();
  proxies_.clear();  // after the stages, so none sees its link fail first
}

SupervisedRing::~SupervisedRing() { Stop(); }

}  // namespace kvasir::node
