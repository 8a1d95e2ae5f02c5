#include "serve/ring_access.h"

#include <chrono>

#include "base/log.h"

namespace kvasir::serve {

std::unique_ptr<RingAccess> RingAccess::Start(RingAccessOptions options) {
  std::unique_ptr<RingAccess> a(new RingAccess(std::move(options)));
  a->watcher_ = std::thread([p = a.get()] { p->Watch(); });
  return a;
}

RingAccess::~RingAccess() { Stop(); }

void RingAccess::Stop() {
  std::vector<std::unique_ptr<ring::RingClient>> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (ring::RingClient* c : in_use_) c->Abort();
    if (watching_ != nullptr) watching_->Abort();
    idle.swap(idle_);
  }
  cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

Result<std::unique_ptr<ring::RingClient>> RingAccess::Take() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Error(StatusCode::kUnavailable, "the server is stopping");
    while (!idle_.empty()) {
      std::unique_ptr<ring::RingClient> c = std::move(idle_.back());
      idle_.pop_back();
      if (!c->usable()) continue;
      in_use_.insert(c.get());
      return c;
    }
  }
  ring::ClientOptions co = o_.client;
  co.connect_timeout_ms = o_.connect_timeout_ms;
  // A head takes only a few handshakes from one address at a time (the rest wait or are cut), so
  // new links are made a few at a time; a link cut in its handshake is tried once more.
  Result<std::unique_ptr<ring::RingClient>> c = Error("not connected");
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || connecting_ < kMaxConnecting; });
      if (stopping_) return Error(StatusCode::kUnavailable, "the server is stopping");
      ++connecting_;
    }
    c = ring::RingClient::Connect(o_.head, co);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --connecting_;
    }
    cv_.notify_all();
    if (c.ok() || c.status().code() == StatusCode::kUnauthenticated) break;
  }
  if (!c.ok()) {
    Refresh();
    return c.status().WithCode(c.status().code() == StatusCode::kUnauthenticated
                                   ? StatusCode::kUnauthenticated
                                   : StatusCode::kUnavailable);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return Error(StatusCode::kUnavailable, "the server is stopping");
  in_use_.insert(c->get());
  return std::move(c).value();
}

void RingAccess::Give(std::unique_ptr<ring::RingClient> client) {
  if (client == nullptr) return;
  std::unique_lock<std::mutex> lock(mu_);
  in_use_.erase(client.get());
  if (stopping_ || !client->usable() || idle_.size() >= static_cast<size_t>(o_.max_idle)) {
    lock.unlock();
    client.reset();  // its link closes outside the lock
    return;
  }
  idle_.push_back(std::move(client));
}

std::string RingAccess::why_down() const {
  std::lock_guard<std::mutex> lock(mu_);
  return up_.load() ? "" : why_down_;
}

std::vector<wire::StageStats> RingAccess::stages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stages_;
}

void RingAccess::Refresh() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    refresh_ = true;
  }
  cv_.notify_all();
}

bool RingAccess::WaitUp(int timeout_ms) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    return up_.load() || stopping_;
  }) && up_.load();
}

void RingAccess::SetState(bool up, std::string why, std::vector<wire::StageStats> stages) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (up != up_.load()) {
      if (up) {
        KV_LOG_INFO("serve: the ring at {} is up ({} stages)", o_.head, stages.size());
      } else {
        KV_LOG_WARN("serve: the ring at {} is down: {}", o_.head, why);
      }
    }
    up_ = up;
    why_down_ = std::move(why);
    if (up) stages_ = std::move(stages);
  }
  cv_.notify_all();
}

void RingAccess::Watch() {
  std::unique_ptr<ring::RingClient> watch;
  auto drop = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    watching_ = nullptr;
    watch.reset();
  };
  ring::ClientOptions co = o_.client;
  co.connect_timeout_ms = std::min(o_.connect_timeout_ms, 2000);
  co.token_timeout_ms = std::max(o_.watch_interval_ms * 5, 5000);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
    }
    if (watch == nullptr || !watch->usable()) {
      auto c = ring::RingClient::Connect(o_.head, co);
      drop();
      if (c.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        watch = std::move(c).value();
        watching_ = watch.get();
        if (stopping_) watch->Abort();
      } else {
        SetState(false, c.status().message(), {});
      }
    }
    if (watch != nullptr) {
      auto stats = watch->Stats();
      if (stats.ok()) {
        SetState(true, "", std::move(stats).value());
      } else {
        SetState(false, stats.status().message(), {});
        if (!watch->usable()) drop();
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    // Faster while down, so the ring is seen up soon after it closes.
    const int wait_ms = up_.load() ? o_.watch_interval_ms : std::min(o_.watch_interval_ms, 250);
    cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return stopping_ || refresh_; });
    refresh_ = false;
  }
  drop();
}

}  // namespace kvasir::serve
