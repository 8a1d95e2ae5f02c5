// What the link tests share: a stage's HELLO for a window, and the events a link part tells its
// owner, kept in order and waited on with a deadline (successor_link_test, predecessor_side_test).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "ring/wire.h"

namespace kvasir::ring {

inline wire::Hello HelloOf(wire::Role role, uint32_t first, uint32_t last,
                           uint64_t generation = 0) {
  wire::Hello h{};
  h.protocol_version = wire::kProtocolVersion;
  h.role = static_cast<uint32_t>(role);
  h.window_first = first;
  h.window_last = last;
  h.generation = generation;
  return h;
}

class Events {
 public:
  void Add(std::string e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
    cv_.notify_all();
  }
  // The next event within `wait_ms`, or "(none)".
  std::string Next(int wait_ms = 10000) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return !events_.empty(); })) {
      return "(none)";
    }
    std::string e = std::move(events_.front());
    events_.pop_front();
    return e;
  }
  // The events told and not yet taken, taken now.
  std::vector<std::string> Rest() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> rest(events_.begin(), events_.end());
    events_.clear();
    return rest;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> events_;
};

}  // namespace kvasir::ring
