// PredecessorSide, part 1: starting and stopping, the links it holds, and the dialed predecessors
// (a relayed predecessor, and the relayed standbys of the predecessor's window, served as
// accepted ones). Accepted connections are in predecessor_accept.cpp.
#include "ring/predecessor_side.h"

#include <fmt/format.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>

#include "base/log.h"
#include "ring/successor_link.h"

namespace kvasir::ring {

PredecessorSide::PredecessorSide(PredecessorSideOptions options, net::Listener listener)
    : options_(std::move(options)),
      listener_(std::move(listener)),
      pending_(PendingTable::Limits{
          options_.max_pending, options_.max_pending_per_address, options_.pending_reserved,
          std::chrono::milliseconds(options_.handshake_timeout_ms),
          std::chrono::milliseconds(options_.pressure_handshake_timeout_ms)}),
      client_budget_(ByteBudget::Create(options_.client_buffer_bytes)) {
  // The standbys of the predecessor's window prove their own keys.
  options_.stage_auth.also_accept = [this](const PublicKey& k) { return AcceptsStandby(k); };
}

PredecessorSide::~PredecessorSide() { Stop(); }

void PredecessorSide::Start() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (!running_.load() || started_) return;
  started_ = true;
  watch_ = Watchdog::Get().Add([this] { Housekeeping(); });
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  trim_thread_ = std::thread([this] { TrimLoop(); });
  if (options_.dial_pred) pred_thread_ = std::thread([this] { PredDialLoop(); });
  if (options_.dial_check) {
    check_thread_ = std::thread([this] { StandbyDialLoop(options_.dial_check, check_retired_); });
  }
}

void PredecessorSide::Stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  auto close_all = [this] {
    {
      std::lock_guard<std::mutex> lock(threads_mu_);
      CutAllPending("the stage is stopping");
    }
    // Outside threads_mu_: a Link's destructor waits for the watchdog, whose Housekeeping()
    // takes threads_mu_.
    links_.CloseAll();
  };
  if (running_.exchange(false)) {
    listener_.Close();
    {
      std::lock_guard<std::mutex> lock(backoff_mu_);
      backoff_cv_.notify_all();
    }
    close_all();
    std::lock_guard<std::mutex> lock(trim_mu_);
    trim_cv_.notify_all();
  }
  if (watch_ != 0) {
    Watchdog::Get().Remove(watch_);
    watch_ = 0;
  }
  for (std::thread* t : {&accept_thread_, &pred_thread_, &check_thread_, &trim_thread_}) {
    if (t->joinable() && t->get_id() != std::this_thread::get_id()) t->join();
  }
  JoinStandbyDialers();
  // No thread accepts or dials any more: close what they opened last, and wait for every
  // connection thread to end.
  close_all();
  std::unique_lock<std::mutex> lock(threads_mu_);
  conns_cv_.wait(lock, [this] { return live_conns_ == 0; });
}

bool PredecessorSide::pred_up() const {
  std::lock_guard<std::mutex> lock(links_mu_);
  return pred_ != nullptr;
}

size_t PredecessorSide::clients() const {
  std::lock_guard<std::mutex> lock(links_mu_);
  return clients_.size();
}

void PredecessorSide::SendToClient(uint64_t client, const Message& m) {
  std::shared_ptr<Link> link;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    auto it = clients_.find(client);
    if (it != clients_.end()) link = it->second;
  }
  // A client that does not read is closed by its link (bounded queue); the caller never waits
  // for a client.
  if (link == nullptr) return;
  if (Status s = link->Send(m); !s.ok()) {
    if (!link->closed() || s.code() == StatusCode::kTooLarge) {
      KV_LOG_WARN("{}: dropped client {}: {}", options_.name, client, s.message());
    }
    link->Close();
  }
}

bool PredecessorSide::Track(const std::shared_ptr<Link>& link) {
  return running_.load() && links_.Add(link);
}

void PredecessorSide::Refused(const std::string& peer, const Status& why) {
  if (options_.on_refused) options_.on_refused();
  if (running_.load()) KV_LOG_WARN("{}: refused {}: {}", options_.name, peer, why.message());
}

void PredecessorSide::TrimLoop() {
  uint64_t trimmed = 0;
  std::unique_lock<std::mutex> lock(trim_mu_);
  while (running_.load()) {
    trim_cv_.wait_for(lock, std::chrono::seconds(1), [this] { return !running_.load(); });
    const uint64_t ended = conns_ended_.load();
    if (ended == trimmed) continue;
    // The allocator keeps what ended connections freed in its per-thread arenas; after a flood
    // that would stay resident for good. Hand whole free pages back, here rather than on a
    // thread anything waits for.
    trimmed = ended;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
  }
}

void PredecessorSide::Backoff(int* backoff_ms) {
  const int wait = JitteredBackoffMs(*backoff_ms);
  std::unique_lock<std::mutex> lock(backoff_mu_);
  backoff_cv_.wait_for(lock, std::chrono::milliseconds(wait), [this] { return !running_.load(); });
  *backoff_ms = std::min(*backoff_ms * 2, kMaxBackoffMs);
}

void PredecessorSide::PredDialLoop() {
  int backoff_ms = kMinBackoffMs;
  std::string last_failure;  // each new reason is logged once, not every retry
  const std::function<bool()> cancelled = [this] { return !running_.load(); };
  while (running_.load()) {
    auto stream = options_.dial_pred(cancelled);
    Status s = stream.status();
    const auto started = std::chrono::steady_clock::now();
    if (stream.ok()) {
      // Served on this thread: one relayed predecessor connection at a time.
      s = ServeConnection(std::move(stream).value(), /*pending=*/nullptr);
      if (s.ok() && std::chrono::steady_clock::now() - started >= kStableLink) {
        backoff_ms = kMinBackoffMs;
        last_failure.clear();
      }
    }
    if (!s.ok() && running_.load() && s.message() != last_failure) {
      KV_LOG_INFO("{}: waiting for predecessor: {}", options_.name, s.message());
      last_failure = s.message();
    }
    Backoff(&backoff_ms);
  }
}

void PredecessorSide::SetStandbys(const std::vector<StandbyPeer>& pred) {
  std::lock_guard<std::mutex> lock(standby_mu_);
  standby_keys_.clear();
  for (const StandbyPeer& p : pred) standby_keys_.push_back(p.key);
  // Relayed predecessor standbys: an edge each, kept dialed while listed.
  for (StandbyDialer& d : dialers_) {
    const bool listed = std::any_of(pred.begin(), pred.end(),
                                    [&](const StandbyPeer& p) { return p.dial && p.via == d.via; });
    if (!listed) d.retired->store(true);
  }
  for (const StandbyPeer& p : pred) {
    if (!p.dial || !running_.load()) continue;
    const bool dialing = std::any_of(dialers_.begin(), dialers_.end(), [&](const auto& d) {
      return d.via == p.via && !d.retired->load();
    });
    if (dialing) continue;
    StandbyDialer d;
    d.via = p.via;
    d.retired = std::make_shared<std::atomic<bool>>(false);
    d.thread =
        std::thread([this, dial = p.dial, retired = d.retired] { StandbyDialLoop(dial, retired); });
    dialers_.push_back(std::move(d));
  }
}

void PredecessorSide::StandbyDialLoop(DialHook dial, std::shared_ptr<std::atomic<bool>> retired) {
  int backoff_ms = kMinBackoffMs;
  // A retired dialer's wait on the relay is cut too: its edge is not kept any more.
  const std::function<bool()> cancelled = [this, retired] {
    return !running_.load() || retired->load();
  };
  while (running_.load() && !retired->load()) {
    auto stream = dial(cancelled);
    if (stream.ok()) {
      // Served here as an accepted predecessor: the standby's link when it is adopted (or the
      // market's check, on a check edge).
      (void)ServeConnection(std::move(stream).value(), /*pending=*/nullptr);
    }
    if (!retired->load()) Backoff(&backoff_ms);
  }
}

void PredecessorSide::JoinStandbyDialers() {
  std::vector<StandbyDialer> dialers;
  {
    std::lock_guard<std::mutex> lock(standby_mu_);
    dialers = std::move(dialers_);
    dialers_.clear();
  }
  for (StandbyDialer& d : dialers) {
    if (d.thread.joinable()) d.thread.join();
  }
}

bool PredecessorSide::AcceptsStandby(const PublicKey& key) {
  std::lock_guard<std::mutex> lock(standby_mu_);
  return std::find(standby_keys_.begin(), standby_keys_.end(), key) != standby_keys_.end();
}

}  // namespace kvasir::ring
