// Status and Result<T>: the error tier for anything that comes from outside the process (files,
// peers, users). Internal invariants use KV_CHECK (check.h) instead.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kvasir {

// What kind of failure a Status is, for callers that branch on it (never on message text).
enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidInput,     // malformed or refused input: a file, a flag, a peer's frame (the default)
  kUnavailable,      // a peer, server or resource is not reachable now; retrying may help
  kEndOfStream,      // the peer closed the stream in order
  kTooLarge,         // a size or count over a limit
  kUnauthenticated,  // a missing or failed proof of identity
  kTimeout,          // a deadline passed
  kNotFound,         // the thing asked for does not exist (a model, a claim)
  kConflict,         // lost a race: what was asked for is held by someone else
  kForbidden,        // authenticated, but not allowed to do this (another's claim)
};

// "invalid input", "unavailable", ...
const char* StatusCodeName(StatusCode code);

// An error message, or success. Messages name the thing and what is wrong:
// "stage.gguf: tensor blk.3.attn_q.weight: offset 912 past end of file (size 800)".
class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message, StatusCode code = StatusCode::kInvalidInput) {
    return Status(std::move(message), code == StatusCode::kOk ? StatusCode::kInvalidInput : code);
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // Returns this error with `prefix: ` in front (adds context as errors travel up); the code stays.
  Status WithContext(std::string_view prefix) const {
    if (ok()) return *this;
    return Status(fmt::format("{}: {}", prefix, message_), code_);
  }
  // The same message under another code.
  Status WithCode(StatusCode code) const {
    if (ok()) return *this;
    return Error(message_, code);
  }

 private:
  Status(std::string message, StatusCode code) : message_(std::move(message)), code_(code) {}
  std::string message_;
  StatusCode code_ = StatusCode::kOk;
};

template <typename... Args>
Status Error(fmt::format_string<Args...> f, Args&&... args) {
  return Status::Error(fmt::format(f, std::forward<Args>(args)...));
}

// An error of a given kind: Error(StatusCode::kEndOfStream, "{}: peer closed", what).
template <typename... Args>
Status Error(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status::Error(fmt::format(f, std::forward<Args>(args)...), code);
}

// A value or an error Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: must be an error

  bool ok() const { return v_.index() == 0; }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<1>(v_);
  }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvasir

// Returns the error of a Status-returning expression from the current function.
#define KV_RETURN_IF_ERROR(expr)              \
  do {                                        \
    ::kvasir::Status kv_status_ = (expr);     \
    if (!kv_status_.ok()) return kv_status_;  \
  } while (0)

#define KV_CONCAT_INNER_(a, b) a##b
#define KV_CONCAT_(a, b) KV_CONCAT_INNER_(a, b)
// `KV_ASSIGN_OR_RETURN(auto x, MakeX());` declares x or returns MakeX()'s error.
#define KV_ASSIGN_OR_RETURN(lhs, expr) KV_ASSIGN_OR_RETURN_IMPL_(KV_CONCAT_(kv_result_, __LINE__), lhs, expr)
#define KV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
