#include "net/http_stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace kvasir::net {

HttpBodyStream::HttpBodyStream(size_t max_pending_bytes)
    : max_pending_(std::max<size_t>(max_pending_bytes, 1)) {}

bool HttpBodyStream::Write(std::string bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  if (gone_ || ended_) return !gone_;
  if (bytes.empty()) return true;
  if (pending_.size() + bytes.size() > max_pending_) {
    const std::string why =
        fmt::format("the client reads too slowly ({} bytes waiting to be sent, at most {})",
                    pending_.size() + bytes.size(), max_pending_);
    lock.unlock();
    MarkGone(why);
    return false;
  }
  const bool was_empty = pending_.empty();
  pending_.append(bytes);
  // The connection takes everything at once: one wake per batch of writes is enough.
  if (was_empty && wake_) wake_();
  return true;
}

void HttpBodyStream::End() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_ || gone_) return;
  ended_ = true;
  if (wake_) wake_();
}

bool HttpBodyStream::gone() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gone_;
}

std::string HttpBodyStream::why_gone() const {
  std::lock_guard<std::mutex> lock(mu_);
  return why_gone_;
}

void HttpBodyStream::OnGone(std::function<void()> callback) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!gone_) {
    on_gone_.push_back(std::move(callback));
    return;
  }
  const bool fire = !ended_;
  lock.unlock();
  if (fire) callback();
}

void HttpBodyStream::Attach(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = std::move(wake);
  if (wake_ && (gone_ || ended_ || !pending_.empty())) wake_();
}

void HttpBodyStream::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = nullptr;
}

HttpBodyStream::Taken HttpBodyStream::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  Taken t;
  t.bytes.swap(pending_);
  t.ended = ended_;
  return t;
}

void HttpBodyStream::MarkGone(const std::string& why) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (gone_) return;
    gone_ = true;
    why_gone_ = why;
    pending_.clear();
    pending_.shrink_to_fit();
    if (!ended_) callbacks.swap(on_gone_);
    on_gone_.clear();
    // The connection closes when it sees the stream gone (a slow reader dropped by Write).
    if (wake_) wake_();
  }
  for (auto& cb : callbacks) cb();
}

}  // namespace kvasir::net
