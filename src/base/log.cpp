#include "base/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

namespace kvasir {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_mu;
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

void LogLine(LogLevel level, std::string_view line) {
  static constexpr const char* kTags[] = {"debug", "info", "warn", "error", ""};
  std::string out = fmt::format("[{}] {}\n", kTags[static_cast<int>(level)], line);
  std::lock_guard<std::mutex> lock(g_mu);
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
}

}  // namespace kvasir
