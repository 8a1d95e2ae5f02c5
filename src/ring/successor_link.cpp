// SuccessorLink: dial, handshake, HELLO, read until down, back off, again (successor_link.h).
#include "ring/successor_link.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <random>

#include "base/log.h"
#include "base/watchdog.h"
#include "ring/frame.h"
#include "ring/messages.h"
#include "ring/secure_stream.h"

namespace kvasir::ring {

int JitteredBackoffMs(int backoff_ms) {
  thread_local std::mt19937 rng{std::random_device{}()};
  return std::uniform_int_distribution<int>(backoff_ms / 2, backoff_ms * 3 / 2)(rng);
}

SuccessorLink::SuccessorLink(SuccessorLinkOptions options) : options_(std::move(options)) {}

bool SuccessorLink::up() const {
  std::lock_guard<std::mutex> lock(mu_);
  return link_ != nullptr;
}

void SuccessorLink::Stop() {
  std::shared_ptr<Link> link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_.store(false);
    cv_.notify_all();
    link = link_;
  }
  if (link != nullptr) link->Close();
}

void SuccessorLink::Backoff(int* backoff_ms) {
  const int wait = JitteredBackoffMs(*backoff_ms);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(wait), [this] { return !running_.load(); });
  *backoff_ms = std::min(*backoff_ms * 2, kMaxBackoffMs);
}

bool SuccessorLink::SendFrame(std::vector<uint8_t> frame) {
  std::shared_ptr<Link> link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    link = link_;
  }
  if (link == nullptr) return false;
  if (!link->SendFrame(std::move(frame)).ok()) {
    link->Close();
    return false;
  }
  return true;
}

Result<std::shared_ptr<Link>> SuccessorLink::Open(std::unique_ptr<net::Stream> raw) {
  const std::string& desc = options_.desc;
  net::Stream* raw_ptr = raw.get();
  std::optional<DeadlineGuard> guard;
  guard.emplace(
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.handshake_timeout_ms),
      [raw_ptr] { raw_ptr->Shutdown(); });
  auto timed_out = [&](Status s) {
    if (guard->expired()) {
      return Error(StatusCode::kTimeout, "successor {}: handshake not completed within {} ms", desc,
                   options_.handshake_timeout_ms);
    }
    return s.WithContext("successor " + desc);
  };
  auto hs = HandshakeInitiate(*raw, wire::Role::kStage, options_.auth);
  if (!hs.ok()) return timed_out(hs.status());
  auto link = std::make_shared<Link>(
      std::make_unique<SecureStream>(std::move(raw), hs->tx, hs->rx,
                                     sizeof(wire::FrameHeader) + options_.max_payload),
      fmt::format("successor {} ({})", desc, hs->peer_desc), options_.link);
  if (options_.track && !options_.track(link)) {
    return Error(StatusCode::kUnavailable, "the stage is stopping");
  }
  Status s = link->Send(HelloMsg{options_.hello});
  auto reply = s.ok() ? link->Receive() : Result<Message>(s);
  if (!reply.ok()) return timed_out(reply.status());
  if (auto* e = std::get_if<ErrorMsg>(&*reply)) {
    return Error("successor {} refused the link: {}", desc, e->message);
  }
  auto* h = std::get_if<HelloMsg>(&*reply);
  if (h == nullptr) {
    return Error("successor {} answered HELLO with {}", desc, MessageName(*reply));
  }
  if (options_.check_hello) {
    KV_RETURN_IF_ERROR(options_.check_hello(h->hello).WithContext("successor " + desc));
  }
  guard.reset();
  return link;
}

void SuccessorLink::Run() {
  int backoff_ms = kMinBackoffMs;
  bool logged_wait = false;
  std::string last_refusal;
  const std::function<bool()> cancelled = [this] { return !running_.load(); };
  while (running_.load()) {
    auto stream = options_.dial(cancelled);
    if (!stream.ok()) {
      if (!logged_wait && running_.load()) {
        if (options_.log_dial_error) {
          KV_LOG_INFO("{}: waiting for successor: {}", options_.name, stream.status().message());
        } else {
          KV_LOG_INFO("{}: waiting for successor {}", options_.name, options_.desc);
        }
        logged_wait = true;
      }
      Backoff(&backoff_ms);
      continue;
    }
    auto opened = Open(std::move(stream).value());
    if (!opened.ok()) {
      // Once per reason: a refusal repeats on every retry until something changes.
      if (running_.load() && opened.status().message() != last_refusal) {
        KV_LOG_WARN("{}: {}", options_.name, opened.status().message());
        last_refusal = opened.status().message();
      }
      if (opened.status().code() != StatusCode::kEndOfStream && options_.on_refused) {
        options_.on_refused();
      }
      Backoff(&backoff_ms);
      continue;
    }
    std::shared_ptr<Link> link = *opened;
    const auto up_since = std::chrono::steady_clock::now();
    logged_wait = false;
    last_refusal.clear();
    KV_LOG_INFO("{}: link up: {}", options_.name, link->what());
    {
      std::lock_guard<std::mutex> lock(mu_);
      link_ = link;
    }
    if (!running_.load()) link->Close();  // Stop() came before link_ was set
    if (options_.on_change) options_.on_change(true, "");
    // The successor only sends errors back; read until the link ends.
    std::string why = "closed";
    while (running_.load()) {
      auto msg = link->Receive();
      if (!msg.ok()) {
        why = msg.status().message();
        break;
      }
      if (auto* e = std::get_if<ErrorMsg>(&*msg)) {
        KV_LOG_WARN("{}: successor reports: {}", options_.name, e->message);
      }
    }
    link->Close();
    {
      std::lock_guard<std::mutex> lock(mu_);
      link_.reset();
    }
    if (running_.load()) {
      KV_LOG_WARN("{}: link down: successor {}: {}", options_.name, options_.desc, why);
      if (options_.on_change) {
        options_.on_change(false, "link to successor " + options_.desc + " down");
      }
    }
    if (std::chrono::steady_clock::now() - up_since >= kStableLink) backoff_ms = kMinBackoffMs;
    Backoff(&backoff_ms);
  }
}

}  // namespace kvasir::ring
