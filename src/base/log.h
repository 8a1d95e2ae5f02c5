// Logging to stderr (stdout is reserved for program output such as generated text).
// Thread-safe: each call writes one whole line.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace kvasir {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kQuiet = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void LogLine(LogLevel level, std::string_view line);

template <typename... Args>
void Log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < GetLogLevel()) return;
  LogLine(level, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kvasir

#define KV_LOG_DEBUG(...) ::kvasir::Log(::kvasir::LogLevel::kDebug, __VA_ARGS__)
#define KV_LOG_INFO(...) ::kvasir::Log(::kvasir::LogLevel::kInfo, __VA_ARGS__)
#define KV_LOG_WARN(...) ::kvasir::Log(::kvasir::LogLevel::kWarn, __VA_ARGS__)
#define KV_LOG_ERROR(...) ::kvasir::Log(::kvasir::LogLevel::kError, __VA_ARGS__)
