// The link a stage dials: to its successor in the ring. SuccessorLink keeps it up: it dials,
// runs the handshake as the initiator (ring/handshake.h) and HELLO within a deadline, then reads
// until the link ends (a successor only sends errors back), and dials again after a jittered
// backoff. It tells its owner through events (up; down, with the reason) and carries frames to
// the successor. It knows nothing of sessions: what HELLO says and what a refusal counts are the
// owner's, through SuccessorLinkOptions. Run() on one thread; everything else is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "net/stream.h"
#include "ring/handshake.h"
#include "ring/link.h"
#include "ring/wire.h"

namespace kvasir::ring {

// Redial backoff: it starts at kMinBackoffMs and doubles up to kMaxBackoffMs; a link that stayed
// up kStableLink resets it, one that drops sooner keeps doubling it, so two stages fighting over
// one place (a second copy started by mistake) redial slowly.
inline constexpr int kMinBackoffMs = 100;
inline constexpr int kMaxBackoffMs = 5000;
inline constexpr auto kStableLink = std::chrono::seconds(10);
// A wait drawn in [0.5, 1.5) x backoff_ms (full jitter), so stages that lost a link at the same
// moment do not redial in lockstep. Thread-safe.
int JitteredBackoffMs(int backoff_ms);

struct SuccessorLinkOptions {
  std::string name;  // the stage, in log lines
  std::string desc;  // the successor, in messages: "127.0.0.1:5001", or a relay's URL
  // Opens a raw stream to the successor; `cancelled` turns true when the link is stopped.
  std::function<Result<std::unique_ptr<net::Stream>>(const std::function<bool()>& cancelled)> dial;
  // Whether the log line while waiting for the successor gives the dial's error (a relay's
  // refusal says more than a TCP port that is not open yet).
  bool log_dial_error = true;
  LinkAuth auth;                     // this stage's proofs, and the successor's key when required
  int handshake_timeout_ms = 10000;  // handshake and HELLO together
  uint32_t max_payload = 0;          // the largest frame payload either way
  LinkOptions link;                  // the established link's (timeout, queue)
  wire::Hello hello;                 // what this stage says in HELLO
  // Checks the successor's HELLO; an error refuses the link.
  std::function<Status(const wire::Hello&)> check_hello;
  // Registers a new link so that its owner can close it when stopping; false: do not use it.
  std::function<bool(const std::shared_ptr<Link>&)> track;
  // The link came up (`up`), or went down (with `reason`); not called once stopped.
  std::function<void(bool up, const std::string& reason)> on_change;
  // A successor refused, or was refused (not counted: one that closed the connection).
  std::function<void()> on_refused;
};

class SuccessorLink {
 public:
  explicit SuccessorLink(SuccessorLinkOptions options);

  // Keeps the link up until Stop(). Blocks.
  void Run();
  // Ends Run() at its next wait (a dial in progress finishes first), and closes the link.
  void Stop();

  // Sends an encoded frame to the successor. False when the link is down, or the send failed
  // (then the link is closed: Run() tells the owner and dials again).
  bool SendFrame(std::vector<uint8_t> frame);
  bool up() const;

 private:
  // Handshake + HELLO with the successor over `raw`, within the handshake deadline.
  Result<std::shared_ptr<Link>> Open(std::unique_ptr<net::Stream> raw);
  // Waits out the backoff (or until Stop()), and doubles it.
  void Backoff(int* backoff_ms);

  SuccessorLinkOptions options_;
  std::atomic<bool> running_{true};
  mutable std::mutex mu_;
  std::condition_variable cv_;  // wakes the backoff on Stop()
  std::shared_ptr<Link> link_;  // while up; guarded by mu_
};

}  // namespace kvasir::ring
