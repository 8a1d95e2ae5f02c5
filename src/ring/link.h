// A framed, message-level link over a byte net::Stream (for ring links, an encrypted SecureStream).
// One thread calls Receive(); any thread may Send(), which only queues: a writer thread of the
// link writes the queue out, so a slow peer never blocks the sender beyond what LinkOptions
// allow. The link also keeps itself alive and watches its peer: it sends KEEPALIVE when it has
// written nothing for a while, and closes when the peer has sent nothing for `timeout_ms` while a
// Receive() waits, stops reading for as long, or misses a receive deadline. Counts payload bytes
// both ways.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/watchdog.h"
#include "net/stream.h"
#include "ring/byte_budget.h"
#include "ring/frame.h"
#include "ring/messages.h"

namespace kvasir::ring {

struct LinkOptions {
  // The peer is down after this long without a byte from it, or this long stuck writing to it.
  // KEEPALIVE goes out after a quarter of it without other frames. 0: no liveness at all.
  int timeout_ms = 10000;
  // Frames queued and not yet written, in bytes (with each frame's bookkeeping). A frame is
  // always accepted into an empty queue.
  size_t max_queued_bytes = size_t{64} << 20;
  // A full queue closes the link (a client that does not read) instead of making Send() wait.
  bool drop_when_full = false;
  // Largest frame payload accepted from the peer.
  uint32_t max_payload = wire::kMaxPayload;
  // When set (a client link), charged for the frame decoder's buffer and for every frame queued
  // to the peer; a charge the budget refuses closes the link.
  std::shared_ptr<ByteAccount> account;
};

class Link {
 public:
  // `what` names the link in messages: "successor 127.0.0.1:5001".
  Link(std::unique_ptr<net::Stream> stream, std::string what, LinkOptions options = {});
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  const std::string& what() const { return what_; }

  // Checks that `m` is encodable (an error otherwise, never an abort) and queues it. Waits for
  // room when the queue is full (unless drop_when_full, which closes the link); fails once the
  // link is closed. Thread-safe.
  Status Send(const Message& m);
  // Queues an already encoded frame, as Send(). With an account, the frame is charged to it first
  // (a refused charge closes the link with kTooLarge).
  Status SendFrame(std::vector<uint8_t> frame);
  // Blocks for the next message; KEEPALIVE frames are consumed here. A malformed frame, a closed
  // stream or a liveness failure returns an error (code kEndOfStream when the peer closed in
  // order, kTimeout for liveness and deadlines); the link is unusable afterwards.
  Result<Message> Receive();
  // The next Receive() must return a message within `ms` (0: no deadline), else the link closes
  // with "no message from ... within N s". For clients waiting on a ring.
  void SetReceiveDeadline(int ms);
  // Queues ERROR(code, 0, message), closes the link once it is written (or after a short grace
  // period), and wakes a blocked Receive(). `drop_queue`: the frames still queued are dropped so
  // the ERROR goes first (a peer dropped for not reading). Any thread.
  void Fail(wire::ErrorCode code, const std::string& message, bool drop_queue = false);
  // Shuts the stream down at once, waking a blocked Receive() or Send(). Idempotent, any thread.
  void Close();
  bool closed() const { return closed_.load(); }
  // Fail() was called: the link closes once its ERROR is written.
  bool failing() const;
  // Blocks until the link is closed: after Fail(), until its ERROR is out or the grace period
  // (2 s) has passed. A destructor that finds the ERROR still queued waits only 100 ms for it.
  void WaitClosed();

  uint64_t bytes_in() const { return bytes_in_.load(); }
  uint64_t bytes_out() const { return bytes_out_.load(); }
  size_t queued_bytes() const;

 private:
  using Clock = std::chrono::steady_clock;
  void WriterLoop();
  void Watch();  // on the watchdog thread
  void CloseWith(StatusCode code, std::string reason);
  void Linger();     // after Fail()'s ERROR: net::Stream::Linger unless a Receive() reads
  void DropQueue();  // drops the frames not yet written (and their charges)
  Status ClosedStatus() const;
  static int64_t Now();

  std::unique_ptr<net::Stream> stream_;
  std::string what_;
  LinkOptions options_;
  FrameDecoder decoder_;
  std::vector<uint8_t> read_buf_;

  struct Queued {
    std::vector<uint8_t> frame;
    bool charged = false;  // to options_.account
  };
  // A queued frame's memory besides its bytes: its entry and the allocator's header.
  static constexpr size_t kQueuedOverhead = sizeof(Queued) + 16;
  mutable std::mutex mu_;  // guards the queue and the close reason
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  size_t queued_bytes_ = 0;
  bool flush_then_close_ = false;
  StatusCode close_code_ = StatusCode::kUnavailable;
  std::string close_reason_;

  std::atomic<bool> closed_{false};
  std::atomic<bool> receiving_{false};  // a Receive() is waiting
  std::atomic<bool> lingering_{false};  // the writer drops what still arrives (Fail)
  std::atomic<int64_t> last_rx_ns_;     // last byte, or the start of this Receive()
  std::atomic<int64_t> last_tx_ns_;
  std::atomic<int64_t> writing_since_ns_{0};  // 0: not inside a write
  std::atomic<int64_t> rx_deadline_ns_{0};    // 0: none
  std::atomic<int64_t> fail_deadline_ns_{0};  // 0: not failing
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_{0};
  std::thread writer_;
  Watchdog::Id watch_id_ = 0;
};

}  // namespace kvasir::ring
