// A TCP proxy that behaves like a slow network link, for measuring a ring over "real" hops on one
// machine without netem: it listens on a port, dials a target for every connection it accepts,
// and forwards bytes both ways, each chunk held back by a one-way delay (plus seeded jitter that
// never reorders bytes) and a bandwidth cap. It knows nothing of frames.
//
// Memory: each direction of a connection holds at most `max_queued_bytes` (plus one read of
// 64 KiB); past that it stops reading, so a fast sender is slowed by TCP's own flow control.
// Closing: when either peer ends its side (or a socket fails), the bytes already queued toward
// the other peer are delivered, then both sides are shut down.
// Threads: one accepting, and four per connection (a reader and a writer per direction), so a
// delay never holds up the other direction or another connection.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "base/status.h"
#include "net/delay_schedule.h"
#include "net/stream.h"

namespace kvasir::net {

struct DelayProxyOptions {
  std::string target;                   // HOST:PORT every accepted connection is forwarded to
  LinkShape shape;                      // applied to each direction on its own
  uint64_t max_queued_bytes = 1 << 20;  // per direction of a connection, > 0
  int dial_timeout_ms = 5000;
};

struct DelayProxyStats {
  uint64_t connections = 0;        // accepted and forwarded
  uint64_t bytes_forwarded = 0;    // both directions, all connections
  uint64_t peak_queued_bytes = 0;  // the most one direction of one connection held at once
};

class DelayProxy {
 public:
  // Checks the options (naming what is wrong), binds `host`:`port` (0: a free port) and starts
  // accepting. The target is dialled per connection; a failed dial drops that connection.
  static Result<std::unique_ptr<DelayProxy>> Start(const DelayProxyOptions& options,
                                                   const std::string& host = "127.0.0.1",
                                                   uint16_t port = 0);
  ~DelayProxy();  // Stop()
  DelayProxy(const DelayProxy&) = delete;
  DelayProxy& operator=(const DelayProxy&) = delete;

  uint16_t port() const { return listener_.port(); }
  // "HOST:PORT" to dial instead of the target.
  std::string address() const;
  DelayProxyStats Stats() const;
  // Stops accepting, ends every connection (queued bytes are dropped) and joins every thread.
  // Idempotent; safe from any thread but the proxy's own.
  void Stop();

  // Internals shared with the connections' threads (delay_proxy.cpp), not an API.
  struct Counters {
    std::atomic<uint64_t> connections{0}, bytes{0}, peak_queued{0};
  };
  class Connection;

 private:
  explicit DelayProxy(Listener listener);
  void AcceptLoop();
  void ReapEnded();  // joins and frees connections whose threads have all finished

  DelayProxyOptions options_;
  Listener listener_;
  std::thread acceptor_;
  Counters counters_;
  std::mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_;
  uint64_t next_id_ = 0;
  bool stopped_ = false;
};

}  // namespace kvasir::net
