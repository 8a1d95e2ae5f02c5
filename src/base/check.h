// KV_CHECK: a broken internal assumption is a bug. It aborts with file and line. Never use it on
// bytes from a file, a socket or a user: those return Status.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace kvasir::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace kvasir::internal

#define KV_CHECK(cond, ...)                                                                    \
  do {                                                                                         \
    if (!(cond)) [[unlikely]] {                                                                \
      ::kvasir::internal::CheckFailed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
    }                                                                                          \
  } while (0)
