#include "base/watchdog.h"

#include <atomic>
#include <vector>

namespace kvasir {

Watchdog& Watchdog::Get() {
  // Leaked on purpose: checks may be removed from static destructors after main returns.
  static Watchdog* w = new Watchdog();
  return *w;
}

Watchdog::Watchdog() {
  std::thread([this] { Loop(); }).detach();
}

Watchdog::Id Watchdog::Add(std::function<void()> check) {
  std::lock_guard<std::mutex> lock(mu_);
  const Id id = next_id_++;
  checks_.emplace(id, std::move(check));
  cv_.notify_one();
  return id;
}

void Watchdog::Remove(Id id) {
  // Taking running_mu_ waits for a pass over the checks that may be running this one.
  std::lock_guard<std::mutex> running(running_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  checks_.erase(id);
}

void Watchdog::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kPeriod);
      if (checks_.empty()) {
        cv_.wait(lock, [this] { return !checks_.empty(); });
      }
    }
    std::lock_guard<std::mutex> running(running_mu_);
    std::vector<std::function<void()>*> now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      now.reserve(checks_.size());
      for (auto& [id, fn] : checks_) now.push_back(&fn);
    }
    // Remove() cannot erase entries while running_mu_ is held, so the pointers stay valid; Add()
    // may insert meanwhile, which std::map allows without moving existing entries.
    for (auto* fn : now) (*fn)();
  }
}

struct DeadlineGuard::State {
  std::chrono::steady_clock::time_point deadline;
  std::function<void()> on_expiry;
  std::atomic<bool> fired{false};
};

DeadlineGuard::DeadlineGuard(std::chrono::steady_clock::time_point deadline,
                             std::function<void()> on_expiry)
    : state_(std::make_shared<State>()) {
  state_->deadline = deadline;
  state_->on_expiry = std::move(on_expiry);
  std::shared_ptr<State> s = state_;
  id_ = Watchdog::Get().Add([s] {
    if (!s->fired.load() && std::chrono::steady_clock::now() >= s->deadline) {
      s->fired.store(true);
      s->on_expiry();
    }
  });
}

DeadlineGuard::~DeadlineGuard() { Watchdog::Get().Remove(id_); }

bool DeadlineGuard::expired() const { return state_->fired.load(); }

}  // namespace kvasir
