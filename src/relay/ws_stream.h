// The stage side of the relay (docs/RELAY.md): dials ws[s]://RELAY/edge/<id>, upgrades to a
// WebSocket, sends the edge hello, and presents the edge as a net::Stream, so a ring link runs
// over the relay exactly as over TCP.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <span>
#include <string>

#include "base/status.h"
#include "net/stream.h"
#include "net/url.h"
#include "relay/edge_token.h"

namespace kvasir::relay {

// A client sends the byte stream as binary messages of at most this many bytes.
inline constexpr size_t kMaxClientMessage = size_t{1} << 20;
// The largest message a client accepts from the relay (the relay's own default limit).
inline constexpr size_t kMaxRelayMessage = size_t{16} << 20;

struct RelayDialOptions {
  std::string ca_file;             // PEM certificates to trust for wss:// instead of the system's
  int connect_timeout_ms = 10000;  // the whole dial: name lookup, TCP, TLS, upgrade and hello
  // Nothing received for half of it: a ping goes out; nothing for all of it: the edge is dead.
  int idle_timeout_ms = 30000;
  // Polled while dialing; returning true abandons the dial (a stage that is stopping).
  std::function<bool()> cancelled;
  // The edge token to send instead of one made from the secret (a market hands each node the
  // tokens of its own edges, never the relay's secret).
  std::optional<EdgeToken> token;
};

// A relay edge URL, checked: ws:// or wss://, path /edge/<id> with a valid edge id.
struct RelayEdgeUrl {
  net::Url url;
  std::string edge_id;
};
// Errors name the text and the rule it breaks.
Result<RelayEdgeUrl> ParseRelayEdgeUrl(const std::string& text);

// Connects to the relay (wss://: certificate and host name verified, SNI sent), upgrades to a
// WebSocket on /edge/<id>, and sends EdgeHello(secret, id, role) as the first message. The stream
// returned follows net::Stream: WriteAll and ReadSome may run on two threads at once, Shutdown
// from any thread wakes both. WriteAll sends binary messages of at most kMaxClientMessage bytes;
// ReadSome returns the bytes of received messages in order (message boundaries mean nothing).
// ReadSome returns 0 after a normal close from the relay and an error naming the relay's reason
// after any other ("relay closed the edge: role taken (close code 1008)"). Keep-alive pings are
// sent while nothing arrives, so a relay that vanished is noticed within idle_timeout_ms.
// peer() is the URL. Dial errors name the URL; WriteAll/ReadSome errors do not repeat it (the
// ring::Link around the stream names the link).
Result<std::unique_ptr<net::Stream>> DialRelayEdge(const std::string& url, Role role,
                                                   std::span<const uint8_t> secret,
                                                   const RelayDialOptions& options);

}  // namespace kvasir::relay
