// Link probe: measures the uplink from this device to the next one in the ring (round trip and
// bandwidth) for devices.json. One side serves (`kvasir profile --link-serve`), the other probes
// (`kvasir profile --link`). The probe has its own tiny protocol over a stream, apart from the ring
// protocol, so a probe never reaches a stage and a stage port never answers a probe.
//
// Protocol (all little-endian, fixed width; version 1):
//   both ways first:  ProbeHello {magic "KVLP", version u16, reserved u16}   the server answers
//                     the client's hello with its own; either side refuses a wrong magic, the
//                     client refuses a server of another version.
//   then client -> server messages ProbeHeader {type u32, reserved u32, value u64}:
//     kPing  value = sequence number            server answers kPong with the same value
//     kData  value = n, followed by n bytes     server reads them all, answers kAck with value n
//     kBye                                      server answers kBye and ends the session
// Every read and write on either side is bounded by a timeout, so a silent or stuck peer ends the
// session with an error naming it, never a hang.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "base/status.h"
#include "net/stream.h"

namespace kvasir::ring {

inline constexpr uint32_t kLinkProbeMagic = 0x504C564B;  // "KVLP"
inline constexpr uint16_t kLinkProbeVersion = 1;
// Largest kData transfer a server accepts in one message.
inline constexpr uint64_t kLinkProbeMaxBytes = uint64_t{1} << 36;

struct LinkProbeOptions {
  int pings = 50;  // round trips timed after one warm-up; the median is the RTT
  uint64_t bytes = uint64_t{64} << 20;  // bytes sent to time the bandwidth (0: skip)
  int connect_timeout_ms = 5000;
  // Longest wait for any one read or write step (a ping's answer, a 256 KiB piece of the data,
  // the handshake). The acknowledgement of the data may take up to this plus twice the time the
  // sending took (bytes still in flight in socket buffers).
  int io_timeout_ms = 10000;
};

struct LinkMeasurement {
  int pings = 0;
  double rtt_ms = 0;  // median
  double rtt_min_ms = 0, rtt_max_ms = 0;
  uint64_t bytes = 0;      // sent for the bandwidth
  double transfer_ms = 0;  // first byte sent until the acknowledgement arrived
  // bytes * 8 / (transfer time less one median round trip), megabits per second; 0 when bytes is 0.
  double bandwidth_mbps = 0;
};

// Probes a server on an open stream: handshake, 1 + `pings` round trips, one data transfer, bye.
// Errors name `stream.peer()` and the step ("127.0.0.1:7000: is not a kvasir link probe server
// (it sent 48 54 54 50 ...)", "...: timed out after 10000 ms waiting for pong 3").
Result<LinkMeasurement> ProbeLink(net::Stream &stream, const LinkProbeOptions &options);
// Connects to host:port and probes it.
Result<LinkMeasurement> ProbeLink(const std::string &host, uint16_t port,
                                  const LinkProbeOptions &options);

struct LinkProbeSessionStats {
  std::string peer;
  int pings = 0;
  uint64_t bytes = 0;  // data bytes received
};

// Serves one probe session on an open stream until the client's bye. Errors name the peer:
// "127.0.0.1:40112: is not a kvasir link probe client (it sent 47 45 54 20 ...)".
Result<LinkProbeSessionStats> ServeLinkProbeSession(net::Stream &stream, int io_timeout_ms);

// Accepts connections and serves one probe session at a time.
class LinkProbeServer {
 public:
  // Binds host:port (port 0 picks a free port). Errors name the address.
  static Result<std::unique_ptr<LinkProbeServer>> Bind(const std::string &host, uint16_t port,
                                                       int io_timeout_ms = 10000);
  uint16_t port() const { return listener_.port(); }

  // Serves sessions one after the other; `on_session` (if set) is called after each with its
  // outcome. A connection refused at the handshake is reported and serving goes on. With `once`,
  // returns the outcome of the first session past the handshake; otherwise returns Ok after Stop().
  // Call from one thread.
  using SessionFn = std::function<void(const Result<LinkProbeSessionStats> &)>;
  Result<LinkProbeSessionStats> Serve(bool once, const SessionFn &on_session = {});
  // Stops serving: closes the listener and ends the current session. Safe from any thread.
  void Stop();

 private:
  LinkProbeServer(net::Listener listener, int io_timeout_ms)
      : listener_(std::move(listener)), io_timeout_ms_(io_timeout_ms) {}
  net::Listener listener_;
  int io_timeout_ms_;
  std::atomic<bool> stopped_{false};
  std::mutex mu_;
  net::Stream *current_ = nullptr;  // guarded by mu_
};

}  // namespace kvasir::ring
