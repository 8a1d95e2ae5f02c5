// The timing rules of a delaying link, apart from sockets: when a chunk that arrived at time t may
// leave (a one-way delay plus seeded jitter, never before the chunk ahead of it), and how long a
// bandwidth cap holds a chunk back (a token bucket). Both are pure and single-threaded: one per
// direction of one connection.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>

namespace kvasir::net {

using DelayClock = std::chrono::steady_clock;

enum class JitterShape : uint8_t {
  kUniform,  // uniform in [-jitter, +jitter]
  kNormal,   // normal with standard deviation `jitter`, cut at +-3 jitter
};

// What a delaying link does to the bytes that cross it, in each direction on its own.
struct LinkShape {
  double delay_ms = 0;   // one-way delay added to every chunk
  double jitter_ms = 0;  // spread of the delay (see JitterShape); a delay never goes below 0
  JitterShape jitter_shape = JitterShape::kUniform;
  double bytes_per_s = 0;  // bandwidth cap; 0: none
  // What the cap lets through at once after an idle spell. One Ethernet frame by default, so each
  // message waits for its own bytes to pass, as on a real link of that rate.
  uint64_t burst_bytes = 1500;
  uint64_t seed = 1;  // of the jitter; each direction of each connection derives its own

  bool delays() const { return delay_ms > 0 || jitter_ms > 0; }
};

// Release times of the chunks of one direction, in arrival order.
class DelaySchedule {
 public:
  DelaySchedule(const LinkShape& shape, uint64_t stream_seed);
  // When a chunk that arrived at `arrival` leaves: arrival + delay + jitter (jitter drawn from the
  // seeded generator, the sum at least 0), but never before the previous chunk's release, so
  // bytes keep their order whatever the jitter draws.
  DelayClock::time_point Release(DelayClock::time_point arrival);

 private:
  LinkShape shape_;
  std::mt19937_64 rng_;
  DelayClock::time_point last_{};
};

// A bandwidth cap: `bytes_per_s` of credit accrues continuously, up to `burst_bytes`.
class TokenBucket {
 public:
  TokenBucket(double bytes_per_s, uint64_t burst_bytes, DelayClock::time_point now);
  // The largest piece of a `want`-byte chunk that may be sent at once (at most the burst).
  uint64_t Piece(uint64_t want) const;
  // When `bytes` (at most Piece()) may leave, given the credit at `now`; Take() then spends it.
  DelayClock::time_point ReadyAt(uint64_t bytes, DelayClock::time_point now);
  void Take(uint64_t bytes, DelayClock::time_point now);

 private:
  void Refill(DelayClock::time_point now);
  double rate_;  // bytes per second, > 0
  double burst_;
  double credit_;
  DelayClock::time_point at_;
};

}  // namespace kvasir::net
