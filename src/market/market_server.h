// The market's HTTP(S) server: Boost.Beast, asynchronous on one event-loop thread, answering each
// request with MarketApi (which owns the store, so all database work is on that thread). Bounded
// per peer: a request's header (8 KiB) and body (1 MiB, refused with 413 on its Content-Length
// before it is read), a deadline for each request (a slow or silent client is dropped), keep-alive
// idle time, and connections per address and in all.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "market/api.h"

namespace kvasir::market {

struct MarketServerOptions {
  std::string listen = "0.0.0.0:8080";  // HOST:PORT (port 0 picks a free one; see port())
  std::string tls_cert, tls_key;        // PEM files; both or neither
  int request_timeout_ms = 10000;       // from a connection's first byte (or the last answer) to
                                        // the end of the next request
  int idle_timeout_ms = 30000;          // a kept-alive connection with no request
  int max_connections = 512;
  int max_connections_per_address = 64;
};

struct MarketServerStats {
  uint64_t connections = 0;  // accepted
  uint64_t requests = 0;     // answered
  uint64_t refused = 0;      // connections closed for a limit, a timeout or a malformed request
};

class MarketServer {
 public:
  // Binds and starts serving on its own thread. `api` must outlive the server.
  static Result<std::unique_ptr<MarketServer>> Start(const MarketServerOptions& options,
                                                     MarketApi* api);
  ~MarketServer();
  MarketServer(const MarketServer&) = delete;
  MarketServer& operator=(const MarketServer&) = delete;

  uint16_t port() const;
  MarketServerStats stats() const;
  // Closes every connection and stops the thread. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit MarketServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

// The wall clock in Unix seconds.
double UnixNow();

}  // namespace kvasir::market
