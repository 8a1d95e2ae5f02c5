// Timing trace: where a request's time goes across the processes of a ring (`--trace-timing` on
// `kvasir serve` and `kvasir stage`). Off by default; when on, each traced event is one line on
// stderr:
//   [timing] <unix microseconds> <who> <event> key=value ...
// Wall-clock microseconds, so the lines of a server and its stages on one machine merge into one
// timeline (bench/trace_timing.py). Thread-safe: each event is one whole write.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <string_view>

namespace kvasir {

namespace timing_internal {
inline std::atomic<bool> g_enabled{false};
}  // namespace timing_internal

void EnableTimingTrace(bool on);
inline bool TimingTraceEnabled() {
  return timing_internal::g_enabled.load(std::memory_order_relaxed);
}
// Writes one event line; `fields` is "key=value ..." (may be empty).
void TimingTraceLine(std::string_view who, std::string_view event, std::string_view fields);

// One event, formatted only when the trace is on.
template <typename... Args>
void TraceTiming(std::string_view who, std::string_view event, fmt::format_string<Args...> f,
                 Args&&... args) {
  if (!TimingTraceEnabled()) return;
  TimingTraceLine(who, event, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kvasir
