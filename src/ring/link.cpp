#include "ring/link.h"

#include <algorithm>

namespace kvasir::ring {
namespace {

constexpr int64_t kMs = 1000000;
constexpr int64_t kFailGraceNs = 2000 * kMs;  // Fail(): how long the ERROR may take to go out
// Fail(): what a peer may still send, unread, before the link is closed under it.
constexpr size_t kLingerBytes = size_t{8} << 20;
constexpr int kDestroyGraceMs = 100;  // ... when the link is destroyed meanwhile

std::string Seconds(int64_t ns) { return fmt::format("{:.1f} s", ns / 1e9); }

}  // namespace

int64_t Link::Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

Link::Link(std::unique_ptr<net::Stream> stream, std::string what, LinkOptions options)
    : stream_(std::move(stream)),
      what_(std::move(what)),
      options_(options),
      decoder_(options.max_payload, options.account),
      read_buf_(16 * 1024),
      last_rx_ns_(Now()),
      last_tx_ns_(Now()) {
  writer_ = std::thread([this] { WriterLoop(); });
  watch_id_ = Watchdog::Get().Add([this] { Watch(); });
}

Link::~Link() {
  {
    // After Fail() the writer may still be sending the ERROR: it gets a moment, not the whole
    // grace period, since whichever thread drops the last reference (the compute thread, say)
    // waits here. Owners that can wait longer call WaitClosed() first.
    std::unique_lock<std::mutex> lock(mu_);
    if (flush_then_close_) {
      cv_.wait_for(lock, std::chrono::milliseconds(kDestroyGraceMs),
                   [this] { return closed_.load(); });
    }
  }
  Close();
  if (writer_.joinable()) writer_.join();
  Watchdog::Get().Remove(watch_id_);
  DropQueue();
}

void Link::DropQueue() {
  std::deque<Queued> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped.swap(queue_);
    for (const Queued& q : dropped) queued_bytes_ -= q.frame.size() + kQueuedOverhead;
    cv_.notify_all();
  }
  for (const Queued& q : dropped) {
    if (q.charged) options_.account->Release(q.frame.size() + kQueuedOverhead);
  }
}

void Link::WaitClosed() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return closed_.load(); });
}

bool Link::failing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return flush_then_close_;
}

size_t Link::queued_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_bytes_;
}

Status Link::Send(const Message& m) {
  if (Status s = CheckEncodable(m); !s.ok()) return s.WithContext(what_);
  return SendFrame(EncodeMessage(m));
}

Status Link::SendFrame(std::vector<uint8_t> frame) {
  // What the frame holds while queued: its bytes, and its entry and allocation besides.
  const size_t n = frame.size() + kQueuedOverhead;
  // Charged before the lock: a charge may close other links (ByteAccount::Charge).
  bool charged = false;
  if (options_.account != nullptr && !closed_.load()) {
    if (!options_.account->Charge(n)) {
      const std::string why = fmt::format(
          "{}: dropped: the stage's buffers for unauthenticated peers are full ({} bytes queued)",
          what_, queued_bytes());
      CloseWith(StatusCode::kTooLarge, why);
      return Error(StatusCode::kTooLarge, "{}", why);
    }
    charged = true;
  }
  auto uncharge = [&] {
    if (charged) options_.account->Release(n);
  };
  std::unique_lock<std::mutex> lock(mu_);
  auto room = [&] {
    return closed_.load() || flush_then_close_ || queued_bytes_ == 0 ||
           queued_bytes_ + n <= options_.max_queued_bytes;
  };
  if (!room()) {
    if (options_.drop_when_full) {
      const std::string why =
          fmt::format("{}: the peer is not reading ({} bytes queued, limit {}); link closed", what_,
                      queued_bytes_, options_.max_queued_bytes);
      lock.unlock();
      uncharge();
      CloseWith(StatusCode::kTooLarge, why);
      return Error(StatusCode::kTooLarge, "{}", why);
    }
    // The writer makes room, or the watchdog closes a link whose peer stopped reading.
    cv_.wait(lock, room);
  }
  if (closed_.load() || flush_then_close_) {
    lock.unlock();
    uncharge();
    return ClosedStatus();
  }
  queued_bytes_ += n;
  queue_.push_back({std::move(frame), charged});
  cv_.notify_all();
  return Status::Ok();
}

void Link::WriterLoop() {
  const auto keepalive_every = std::chrono::milliseconds(std::max(options_.timeout_ms / 4, 1));
  std::unique_lock<std::mutex> lock(mu_);
  while (!closed_.load()) {
    if (queue_.empty()) {
      if (flush_then_close_) {
        lock.unlock();
        Linger();
        Close();
        return;
      }
      if (options_.timeout_ms > 0) {
        cv_.wait_for(lock, keepalive_every);
      } else {
        cv_.wait(lock);
      }
      if (closed_.load()) break;
      if (queue_.empty() && !flush_then_close_ && options_.timeout_ms > 0 &&
          Now() - last_tx_ns_.load() >= keepalive_every.count() * kMs) {
        KeepaliveMsg k;
        k.body.sent_ns = static_cast<uint64_t>(Now());
        std::vector<uint8_t> frame = EncodeMessage(k);
        queued_bytes_ += frame.size() + kQueuedOverhead;
        queue_.push_back({std::move(frame), false});
      }
      continue;
    }
    Queued q = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    const std::vector<uint8_t>& frame = q.frame;
    writing_since_ns_.store(Now());
    Status s = stream_->WriteAll(frame);
    writing_since_ns_.store(0);
    if (q.charged) options_.account->Release(frame.size() + kQueuedOverhead);
    lock.lock();
    queued_bytes_ -= frame.size() + kQueuedOverhead;
    cv_.notify_all();
    if (!s.ok()) {
      lock.unlock();
      CloseWith(StatusCode::kUnavailable, s.WithContext(what_).message());
      return;
    }
    last_tx_ns_.store(Now());
    bytes_out_.fetch_add(frame.size());
  }
}

void Link::Watch() {
  if (closed_.load()) return;
  const int64_t now = Now();
  const int64_t timeout = int64_t{options_.timeout_ms} * kMs;
  // Silence counts only while a reader waits: a link nobody reads (a client between requests)
  // is not declared down for the keepalives piling up unread.
  if (timeout > 0 && receiving_.load() && now - last_rx_ns_.load() > timeout) {
    return CloseWith(StatusCode::kTimeout, fmt::format("{}: nothing received for {} (link timeout)",
                                                       what_, Seconds(now - last_rx_ns_.load())));
  }
  const int64_t writing = writing_since_ns_.load();
  if (timeout > 0 && writing != 0 && now - writing > timeout) {
    return CloseWith(StatusCode::kTimeout,
                     fmt::format("{}: the peer stopped reading ({} stuck writing)", what_,
                                 Seconds(now - writing)));
  }
  const int64_t deadline = rx_deadline_ns_.load();
  if (deadline != 0 && now > deadline) {
    return CloseWith(StatusCode::kTimeout, fmt::format("{}: no message in time", what_));
  }
  const int64_t fail = fail_deadline_ns_.load();
  if (fail != 0 && now > fail) Close();
}

Result<Message> Link::Receive() {
  receiving_.store(true);
  struct Done {
    std::atomic<bool>& flag;
    ~Done() { flag.store(false); }
  } done{receiving_};
  // One reader at a time: Linger() reads and drops once the ERROR of Fail() is out.
  if (lingering_.load()) return ClosedStatus();
  last_rx_ns_.store(std::max(last_rx_ns_.load(), Now()));
  while (true) {
    auto next = decoder_.Next();
    if (!next.ok()) return next.status().WithContext(what_);
    if (next->has_value()) {
      const Frame& f = **next;
      bytes_in_.fetch_add(f.payload.size() + sizeof(wire::FrameHeader));
      auto msg = DecodeMessage(f);
      if (!msg.ok()) return msg.status().WithContext(what_);
      if (std::holds_alternative<KeepaliveMsg>(*msg)) continue;
      if (std::holds_alternative<HandshakeMsg>(*msg)) {
        return Error("{}: HANDSHAKE after the handshake", what_);
      }
      rx_deadline_ns_.store(0);
      return msg;
    }
    if (closed_.load()) return ClosedStatus();
    auto n = stream_->ReadSome(read_buf_);
    if (closed_.load()) return ClosedStatus();
    if (!n.ok()) return n.status().WithContext(what_);
    if (*n == 0) return Error(StatusCode::kEndOfStream, "{}: peer closed the connection", what_);
    last_rx_ns_.store(Now());
    decoder_.Feed(std::span<const uint8_t>(read_buf_.data(), *n));
  }
}

void Link::Linger() {
  // Paired with Receive(): each announces itself before it looks at the other (sequentially
  // consistent), so at most one of them reads. When a Receive() is running, it reads what
  // still arrives itself, and no drain is needed.
  lingering_.store(true);
  if (receiving_.load()) return;
  const int64_t left_ms = (fail_deadline_ns_.load() - Now()) / kMs;
  stream_->Linger(static_cast<int>(std::clamp<int64_t>(left_ms, 0, kFailGraceNs / kMs)),
                  kLingerBytes);
}

void Link::SetReceiveDeadline(int ms) {
  rx_deadline_ns_.store(ms > 0 ? Now() + int64_t{ms} * kMs : 0);
}

void Link::Fail(wire::ErrorCode code, const std::string& message, bool drop_queue) {
  if (closed_.load()) return;
  if (drop_queue) DropQueue();
  ErrorMsg e{code, 0, message.substr(0, wire::kMaxErrorMessage)};
  std::vector<uint8_t> frame = EncodeMessage(e);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (flush_then_close_) return;
    // Before the writer can see the ERROR queued: its Linger() is bounded by this deadline.
    fail_deadline_ns_.store(Now() + kFailGraceNs);
    queued_bytes_ += frame.size() + kQueuedOverhead;
    queue_.push_back({std::move(frame), false});
    flush_then_close_ = true;
    if (close_reason_.empty()) close_reason_ = fmt::format("{}: {}", what_, message);
    cv_.notify_all();
  }
}

void Link::CloseWith(StatusCode code, std::string reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (close_reason_.empty()) {
      close_code_ = code;
      close_reason_ = std::move(reason);
    }
  }
  Close();
}

void Link::Close() {
  if (!closed_.exchange(true)) {
    stream_->Shutdown();
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
}

Status Link::ClosedStatus() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (close_reason_.empty()) return Error(StatusCode::kEndOfStream, "{}: link is closed", what_);
  return Status::Error(close_reason_, close_code_);
}

}  // namespace kvasir::ring
