// The market's HTTP(S) server: net/http_server.h (one event-loop thread) answering each request
// with MarketApi, which owns the store, so all database work is on that thread. Bounded per peer:
// a request's header (8 KiB) and body (1 MiB, refused with 413 on its Content-Length before it is
// read), a deadline for each request and each idle kept-alive connection, and connections per
// address and in all. Under a flood of connections (docs/MARKET.md, "Floods"): a connection whose
// request carried a verified signature moves to a pool of its own, which strangers cannot take; a
// newcomer from an address holding few connections takes the place of the oldest idle one of the
// address holding the most; and silent or idle connections get a second once the open pool is
// half full. A signed request's signature is checked on one of `verify_threads` threads of its own
// (verify_pool.h) before it takes the lock around the API, so that check runs beside the store
// work of another request. Renewals the API holds in memory are flushed by a thread of the server's
// at their interval (MarketConfig::lease_flush_s), and at Stop: on SQLite taken from memory under
// the lock requests are answered with and written on a connection of its own without it
// (Store::TakeLeaseFlush), on PostgreSQL written under the lock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "base/status.h"
#include "market/api.h"
#include "market/verify_pool.h"

namespace kvasir::net {
class HttpServer;
struct HttpServerResponse;
}  // namespace kvasir::net

namespace kvasir::market {

struct MarketServerOptions {
  std::string listen = "0.0.0.0:8080";  // HOST:PORT (port 0 picks a free one; see port())
  std::string tls_cert, tls_key;        // PEM files; both or neither
  int request_timeout_ms = 10000;       // from a connection's first byte (or the last answer) to
                                        // the end of the next request
  int idle_timeout_ms = 30000;          // a kept-alive connection with no request
  int max_connections = 512;            // open pool: connections that proved nothing yet
  int max_connections_per_address = 64;
  int max_proven = 256;  // proven pool: connections that sent a signed request
  int max_proven_per_address = 16;
  // Threads that check signatures before the lock (0: on the server's thread, under the lock),
  // and how many signed requests may wait for one (past that: 503).
  int verify_threads = 2;
  size_t max_verify_waiting = 1024;
};

struct MarketServerStats {
  uint64_t connections = 0;  // accepted
  uint64_t requests = 0;     // answered
  uint64_t refused = 0;      // connections closed for a limit, a timeout or a malformed request
  uint64_t evicted = 0;      // closed for a connection from an address holding fewer
  uint64_t open = 0;         // connections in the open pool now
  uint64_t proven = 0;       // connections in the proven pool now
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
  // Blocks until `done(stats())` holds or `timeout_ms` passes, waking at every change of the
  // server's state; returns whether it holds.
  bool WaitFor(const std::function<bool(const MarketServerStats&)>& done, int timeout_ms) const;
  // Closes every connection, stops the threads and writes the renewals still in memory.
  // Idempotent.
  void Stop();

 private:
  // What the request handler and the flushing thread share.
  struct Shared {
    MarketApi* api = nullptr;
    std::mutex mu;  // around every call into `api`
    std::condition_variable wake;
    bool stopping = false;                  // guarded by mu
    std::unique_ptr<VerifyPool> verifiers;  // null with verify_threads 0
  };
  MarketServer(std::unique_ptr<net::HttpServer> http, std::shared_ptr<Shared> shared);
  void Flusher(int interval_ms);
  // Answers `r` with the API, under shared.mu.
  static net::HttpServerResponse Answer(Shared& shared, const ApiRequest& r);
  std::unique_ptr<net::HttpServer> http_;
  std::shared_ptr<Shared> shared_;
  std::thread flusher_;
};

// The wall clock in Unix seconds.
double UnixNow();

}  // namespace kvasir::market
