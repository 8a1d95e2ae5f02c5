#include "net/delay_schedule.h"

#include <algorithm>
#include <cmath>

namespace kvasir::net {
namespace {

DelayClock::duration Millis(double ms) {
  return std::chrono::duration_cast<DelayClock::duration>(
      std::chrono::duration<double, std::milli>(ms));
}

}  // namespace

DelaySchedule::DelaySchedule(const LinkShape& shape, uint64_t stream_seed)
    : shape_(shape), rng_(shape.seed * 0x9E3779B97F4A7C15ull + stream_seed) {}

DelayClock::time_point DelaySchedule::Release(DelayClock::time_point arrival) {
  double ms = shape_.delay_ms;
  if (shape_.jitter_ms > 0) {
    if (shape_.jitter_shape == JitterShape::kNormal) {
      std::normal_distribution<double> d(0.0, shape_.jitter_ms);
      ms += std::clamp(d(rng_), -3 * shape_.jitter_ms, 3 * shape_.jitter_ms);
    } else {
      std::uniform_real_distribution<double> d(-shape_.jitter_ms, shape_.jitter_ms);
      ms += d(rng_);
    }
  }
  const DelayClock::time_point at = arrival + Millis(std::max(0.0, ms));
  last_ = std::max(last_, at);
  return last_;
}

TokenBucket::TokenBucket(double bytes_per_s, uint64_t burst_bytes, DelayClock::time_point now)
    : rate_(bytes_per_s),
      burst_(static_cast<double>(std::max<uint64_t>(burst_bytes, 1))),
      credit_(burst_),
      at_(now) {}

uint64_t TokenBucket::Piece(uint64_t want) const {
  return std::min<uint64_t>(want, static_cast<uint64_t>(burst_));
}

void TokenBucket::Refill(DelayClock::time_point now) {
  if (now <= at_) return;
  credit_ = std::min(burst_, credit_ + std::chrono::duration<double>(now - at_).count() * rate_);
  at_ = now;
}

DelayClock::time_point TokenBucket::ReadyAt(uint64_t bytes, DelayClock::time_point now) {
  Refill(now);
  const double missing = static_cast<double>(bytes) - credit_;
  if (missing <= 0) return now;
  return now + std::chrono::duration_cast<DelayClock::duration>(
                   std::chrono::duration<double>(missing / rate_));
}

void TokenBucket::Take(uint64_t bytes, DelayClock::time_point now) {
  Refill(now);
  credit_ -= static_cast<double>(bytes);  // may dip below 0 by rounding; later refills repay it
}

}  // namespace kvasir::net
