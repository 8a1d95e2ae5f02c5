// The relay server (docs/RELAY.md): accepts WebSocket connections at /edge/<id> (over TLS when it
// has a certificate), checks each end's role preamble and token, pairs the two ends of an edge and
// forwards messages between them without looking inside. Everything runs asynchronously on one
// event-loop thread (net/server.h), so a slow or silent client holds only its own connection.
// Connections not yet paired are limited per address and in all; an end whose token verified, or
// one that arrives for an edge whose other end already waits, moves to a reserve of its own; under
// pressure the hello deadline shortens and a newcomer from an address holding few connections
// takes the place of one of the address holding the most (docs/RELAY.md, "Floods").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"

namespace kvasir::relay {

struct RelayOptions {
  std::string listen = "0.0.0.0:443";  // HOST:PORT (port 0 picks a free one; see port())
  // A socket that is already bound and listening, served instead of binding `listen`. The relay
  // serves a duplicate and closes only that; the caller keeps its own, so the port stays bound
  // across a relay's stop and a new relay's start. -1: bind `listen`.
  int listen_fd = -1;
  std::string tls_cert, tls_key;        // PEM files; both or neither (neither: plain ws://)
  std::string secret;                   // ring secret; empty = accept any token
  int hello_timeout_ms = 10000;         // TLS + upgrade + first message
  int pressed_hello_timeout_ms = 2000;  // the same once half the places for them are taken
  int pair_timeout_ms = 30000;          // an end waiting for its partner
  int idle_timeout_ms = 120000;         // no traffic and no answer to pings
  int max_pending_per_address = 16;     // connections from one address before their hello
  int max_pending_total = 1024;         // connections from all addresses before their hello
  // The reserve: ends whose token verified (waiting for their partner) and ends arriving for an
  // edge whose other end waits (at most two per such edge), from one address and in all.
  int max_waiting_per_address = 64;
  int max_waiting_total = 1024;
  uint64_t max_message_bytes = uint64_t{16} << 20;
};

struct RelayStats {
  uint64_t connections = 0;      // accepted TCP connections
  uint64_t refused = 0;          // closed before pairing for a reason in the table of RELAY.md
  uint64_t edges_paired = 0;     // pairings so far
  uint64_t edges_active = 0;     // paired now
  uint64_t bytes_forwarded = 0;  // payload bytes, both directions
  uint64_t pending = 0;          // connections not yet paired now (TLS, upgrade, hello, waiting)
  uint64_t reserved = 0;         // of those, in the reserve (token verified, or expected)
  uint64_t evicted = 0;          // closed for a connection from an address holding fewer
};

class RelayServer {
 public:
  // Binds, loads the certificate (errors name the file) and starts serving on its own thread.
  static Result<std::unique_ptr<RelayServer>> Start(const RelayOptions& options);
  ~RelayServer();
  RelayServer(const RelayServer&) = delete;
  RelayServer& operator=(const RelayServer&) = delete;

  uint16_t port() const;
  bool tls() const;
  RelayStats stats() const;
  // Blocks until `done(stats())` holds or `timeout_ms` passes, waking at every change of the
  // relay's state; returns whether it holds.
  bool WaitFor(const std::function<bool(const RelayStats&)>& done, int timeout_ms) const;
  // Closes every connection and stops the thread. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit RelayServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvasir::relay
