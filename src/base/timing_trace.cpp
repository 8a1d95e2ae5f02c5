#include "base/timing_trace.h"

#include <chrono>
#include <cstdio>
#include <string>

namespace kvasir {

void EnableTimingTrace(bool on) { timing_internal::g_enabled.store(on); }

void TimingTraceLine(std::string_view who, std::string_view event, std::string_view fields) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  const std::string line = fmt::format("[timing] {} {} {} {}\n", us, who, event, fields);
  // One fwrite per line: stdio locks the stream, so lines of several threads never interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace kvasir
