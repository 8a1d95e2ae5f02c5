// A framed, message-level link over a byte Stream: one reader thread calls Receive(), any thread may
// Send(). Counts payload bytes both ways for the stage statistics.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "ring/frame.h"
#include "ring/messages.h"
#include "ring/transport.h"

namespace kvasir::ring {

class Link {
 public:
  // `what` names the link in messages: "successor 127.0.0.1:5001".
  Link(std::unique_ptr<Stream> stream, std::string what);
  ~Link();

  const std::string& what() const { return what_; }

  // Encodes and writes one message. Thread-safe; fails once the link is closed.
  Status Send(const Message& m);
  // Writes an already encoded frame. Thread-safe.
  Status SendFrame(const std::vector<uint8_t>& frame);
  // Blocks for the next message. A malformed frame or a closed stream returns an error; the link
  // is unusable afterwards (the caller sends an ERROR if it can and closes).
  Result<Message> Receive();
  // Sends ERROR(code, session, message) as a best effort, then closes.
  void Fail(wire::ErrorCode code, const std::string& message);
  // Shuts the stream down, waking a blocked Receive() or Send(). Idempotent, any thread.
  void Close();
  bool closed() const { return closed_.load(); }

  uint64_t bytes_in() const { return bytes_in_.load(); }
  uint64_t bytes_out() const { return bytes_out_.load(); }

 private:
  std::unique_ptr<Stream> stream_;
  std::string what_;
  FrameDecoder decoder_;
  std::vector<uint8_t> read_buf_;
  std::mutex write_mu_;
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_{0};
};

}  // namespace kvasir::ring
