// The relay server (docs/RELAY.md): accepts WebSocket connections at /edge/<id> (over TLS when it
// has a certificate), checks each end's role preamble and token, pairs the two ends of an edge and
// forwards messages between them without looking inside. Everything runs asynchronously on one
// event-loop thread, so a slow or silent client holds only its own connection.
#pragma once

#include <cstdint>
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
  std::string tls_cert, tls_key;       // PEM files; both or neither (neither: plain ws://)
  std::string secret;                  // ring secret; empty = accept any token
  int hello_timeout_ms = 10000;        // TLS + upgrade + first message
  int pair_timeout_ms = 30000;         // an end waiting for its partner
  int idle_timeout_ms = 120000;        // no traffic and no answer to pings
  int max_pending_per_address = 16;    // connections from one address not yet paired
  int max_pending_total = 1024;        // connections from all addresses not yet paired
  uint64_t max_message_bytes = uint64_t{16} << 20;
};

struct RelayStats {
  uint64_t connections = 0;     // accepted TCP connections
  uint64_t refused = 0;         // closed before pairing for a reason in the table of RELAY.md
  uint64_t edges_paired = 0;    // pairings so far
  uint64_t edges_active = 0;    // paired now
  uint64_t bytes_forwarded = 0;  // payload bytes, both directions
  uint64_t pending = 0;          // connections not yet paired now (TLS, upgrade, hello, waiting)
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
  // Closes every connection and stops the thread. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit RelayServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvasir::relay
