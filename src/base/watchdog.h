// One process-wide thread that runs short checks periodically: link liveness, handshake deadlines.
// A check must not block (it may shut a socket down, set a flag, notify a condition variable).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace kvasir {

class Watchdog {
 public:
  using Id = uint64_t;
  static constexpr std::chrono::milliseconds kPeriod{50};

  // The process's watchdog; its thread starts on first use and is never joined.
  static Watchdog& Get();

  // Runs `check` about every kPeriod on the watchdog thread until Remove(id).
  Id Add(std::function<void()> check);
  // Once this returns, `check` is not running and never runs again. Safe from any thread except
  // from inside a check.
  void Remove(Id id);

 private:
  Watchdog();
  void Loop();

  std::mutex mu_;           // guards checks_ and next_id_
  std::mutex running_mu_;   // held while checks run, so Remove() can wait them out
  std::condition_variable cv_;
  std::map<Id, std::function<void()>> checks_;
  Id next_id_ = 1;
};

// Calls `on_expiry` once (on the watchdog thread) if it is still alive at `deadline`. For a
// handshake deadline: on_expiry shuts the stream down, which wakes a blocked reader.
class DeadlineGuard {
 public:
  DeadlineGuard(std::chrono::steady_clock::time_point deadline, std::function<void()> on_expiry);
  ~DeadlineGuard();
  DeadlineGuard(const DeadlineGuard&) = delete;
  DeadlineGuard& operator=(const DeadlineGuard&) = delete;
  // Whether the deadline passed (and on_expiry ran).
  bool expired() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  Watchdog::Id id_;
};

}  // namespace kvasir
