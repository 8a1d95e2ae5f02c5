// What a stage keeps while its ring is broken (docs/PROTOCOL.md, "Repair"): the sessions it holds
// instead of failing them, each until a deadline, and the generation of the newest neighbour on
// each side, which a frozen process that wakes up later cannot pass. Pure apart from a mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvasir::ring {

// The sessions a stage holds while a link of the ring is down, each until its deadline: a session
// is replayed (Release) or, at the deadline, ended (Expired). Compute thread only.
class HoldBook {
 public:
  using Clock = std::chrono::steady_clock;
  // `timeout`: how long a session is held; zero: sessions are never held (they fail at once).
  explicit HoldBook(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  bool enabled() const { return timeout_.count() > 0; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Holds `ids` from `now`; a session already held keeps its first deadline, so a second break
  // during a repair does not extend it.
  void Hold(std::span<const uint32_t> ids, Clock::time_point now);
  // The session was replayed or ended: no longer held.
  void Release(uint32_t id) { held_.erase(id); }
  bool held(uint32_t id) const { return held_.count(id) != 0; }
  // When `id` started to be held; nothing when it is not held.
  std::optional<Clock::time_point> since(uint32_t id) const;
  // The held sessions whose deadline is at or before `now`, in id order, taken out of the book.
  std::vector<uint32_t> Expired(Clock::time_point now);
  // The held sessions, in id order.
  std::vector<uint32_t> ids() const;
  // The session held longest; nullopt when none is held.
  std::optional<uint32_t> Oldest() const;
  bool empty() const { return held_.empty(); }

 private:
  std::chrono::milliseconds timeout_;
  std::map<uint32_t, Clock::time_point> held_;  // id -> held since
};

// Which process may hold the place on one side of a stage: the newest one seen (by its HELLO's
// generation) or a newer one. A standby adopted after a stage froze is newer than it, so the
// frozen process is refused when it wakes up and dials again. Thread-safe.
class GenerationGate {
 public:
  // Admits a peer of `generation` on `side` ("predecessor", "successor"), remembering it when it
  // is the newest; refuses (kConflict) one older than the newest admitted while `newest_linked`
  // (the newer process still holds the place: once it is gone, an older one may take it back).
  Status Admit(uint64_t generation, std::string_view side, bool newest_linked = true);
  uint64_t newest() const;

 private:
  mutable std::mutex mu_;
  uint64_t newest_ = 0;
};

// A generation for a process starting (or a standby adopted) now: microseconds since the Unix
// epoch, never below `at_least` + 1 when that is given.
uint64_t NewGeneration(uint64_t at_least = 0);

}  // namespace kvasir::ring
