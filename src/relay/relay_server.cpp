#include "relay/relay_server.h"

// <utility> first: Boost 1.74's Asio needs it before its headers under GCC 12 in C++20 mode.
#include <utility>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <chrono>
#include <map>

#include "base/check.h"
#include "base/log.h"
#include "net/server.h"
#include "relay/edge_token.h"
#include "relay/upgrade_request.h"

namespace kvasir::relay {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace websocket = boost::beast::websocket;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

class EndBase;

// Shared by the two ends of a paired edge; the first end to finish tears the pair down.
struct Pairing {
  bool active = true;
};

class EndBase : public net::ServerConnection, public std::enable_shared_from_this<EndBase> {
 public:
  virtual ~EndBase() = default;
  // Paired: start reading this end and forwarding to `partner`.
  virtual void StartBridge(std::shared_ptr<EndBase> partner, std::shared_ptr<Pairing> pairing) = 0;
  // Writes one message to this end; `done` runs when it is written (or failed).
  virtual void Send(asio::const_buffer data, bool binary, std::function<void(error_code)> done) = 0;
  // Closes this end with a close frame when it can, else drops the connection.
  virtual void Shut(websocket::close_code code, const std::string& reason) = 0;
  // Drops the connection at once.
  virtual void Kill() = 0;
  virtual void WaitForPartner() = 0;

  std::string edge;
  Role role = Role::kPredecessorSide;
  std::string address;
};

}  // namespace

struct RelayServer::Impl : std::enable_shared_from_this<RelayServer::Impl> {
  RelayOptions o;
  std::unique_ptr<net::Server> server;

  // Loop thread only.
  struct Slots {
    std::weak_ptr<EndBase> pred, succ;
    int expected = 0;  // ends in the reserve for this edge because the other end waits
  };
  std::map<std::string, Slots> edges;  // by edge id

  std::atomic<uint64_t> refused{0}, edges_paired{0}, edges_active{0}, bytes_forwarded{0};

  std::span<const uint8_t> secret() const {
    return {reinterpret_cast<const uint8_t*>(o.secret.data()), o.secret.size()};
  }

  // Whether an end arriving for `edge` is expected: the edge's other end waits, and fewer than two
  // ends are already in the reserve on its account.
  bool Expected(const std::string& edge) const {
    auto it = edges.find(edge);
    if (it == edges.end() || it->second.expected >= 2) return false;
    return it->second.pred.expired() != it->second.succ.expired();
  }

  std::shared_ptr<net::ServerConnection> Launch(net::Accepted accepted);

  // Registers an end that passed its hello: pairs it, parks it, or refuses it (role taken).
  void Register(const std::shared_ptr<EndBase>& end) {
    Slots& slots = edges[end->edge];
    std::weak_ptr<EndBase>& mine = end->role == Role::kPredecessorSide ? slots.pred : slots.succ;
    std::weak_ptr<EndBase>& theirs = end->role == Role::kPredecessorSide ? slots.succ : slots.pred;
    if (mine.lock() != nullptr) {
      ++refused;
      KV_LOG_WARN("relay: edge {}: {} {} refused: role taken", end->edge, RoleName(end->role),
                  end->address);
      end->Shut(websocket::close_code::policy_error, "role taken");
      return;
    }
    mine = end;
    if (auto other = theirs.lock()) {
      auto pairing = std::make_shared<Pairing>();
      ++edges_paired;
      ++edges_active;
      KV_LOG_INFO("relay: edge {} paired ({} {} <-> {} {})", end->edge, RoleName(end->role),
                  end->address, RoleName(other->role), other->address);
      end->StartBridge(other, pairing);
      other->StartBridge(end, pairing);
    } else {
      end->WaitForPartner();
    }
  }
  void Unreserve(const std::string& edge) {
    auto it = edges.find(edge);
    if (it == edges.end()) return;
    --it->second.expected;
    if (it->second.pred.expired() && it->second.succ.expired() && it->second.expected <= 0) {
      edges.erase(it);
    }
  }
  void Unregister(const EndBase* end) {
    auto it = edges.find(end->edge);
    if (it == edges.end()) return;
    for (std::weak_ptr<EndBase>* slot : {&it->second.pred, &it->second.succ}) {
      if (auto e = slot->lock(); e.get() == end || e == nullptr) slot->reset();
    }
    if (it->second.pred.expired() && it->second.succ.expired() && it->second.expected == 0) {
      edges.erase(it);
    }
  }
};

namespace {

// Where one connection is: the TLS and upgrade handshakes, the hello, waiting for its partner,
// bridging. Its place in the server's table (slot_) carries the deadlines: the hello's from the
// accept (stage kSilent, shorter under pressure), the partner's (kWaiting); a paired end leaves
// the table.
template <class Next>
class End final : public EndBase {
 public:
  using Impl = RelayServer::Impl;

  // `next_args` build the layer under the WebSocket: a socket, or a socket and a TLS context.
  template <class... Args>
  End(std::shared_ptr<Impl> srv, net::ServerSlot slot, Args&&... next_args)
      : srv_(std::move(srv)), slot_(std::move(slot)), ws_(std::forward<Args>(next_args)...) {
    this->address = slot_.ip();
    deadline_ = Clock::now() + std::chrono::milliseconds(srv_->o.hello_timeout_ms);
  }
  ~End() override { Unreserve(); }

  void Start() override {
    if constexpr (kTls) {
      ws_.next_layer().async_handshake(ssl::stream_base::server, [self = Self()](error_code ec) {
        if (ec) return self->Drop(fmt::format("TLS handshake failed: {}", ec.message()));
        self->ReadRequest();
      });
    } else {
      ReadRequest();
    }
  }

  // The server closes this end: a deadline (the hello's or the partner's), an eviction, or stop.
  void Close(net::CloseCause cause) override {
    // Stopping, or a refusal or close handshake that ran past its grace period.
    if (cause == net::CloseCause::kStopping || closing_ || refusing_) return Kill();
    ++srv_->refused;
    slot_.Notify();
    if (waiting_) {
      srv_->Unregister(this);
      if (cause == net::CloseCause::kDeadline) {
        KV_LOG_WARN("relay: edge {}: {} {}: partner did not arrive within {} ms", edge,
                    RoleName(role), address, srv_->o.pair_timeout_ms);
        return Shut(websocket::close_code::going_away, "partner did not arrive");
      }
      KV_LOG_WARN("relay: edge {}: {} {}: evicted while waiting for its partner", edge,
                  RoleName(role), address);
      return Shut(websocket::close_code::try_again_later, "evicted");
    }
    // At debug level: under a flood these come by the thousand; the server's summary counts them.
    KV_LOG_DEBUG("relay: {}{}: {} before its hello; closed", address,
                 edge.empty() ? "" : " on edge " + edge,
                 cause == net::CloseCause::kDeadline ? "no hello in time" : "evicted");
    Kill();
  }

  void StartBridge(std::shared_ptr<EndBase> partner, std::shared_ptr<Pairing> pairing) override {
    waiting_ = false;
    slot_.Release();  // paired: no longer limited
    partner_ = partner;
    pairing_ = std::move(pairing);
    ReadLoop();
  }

  void Send(asio::const_buffer data, bool binary, std::function<void(error_code)> done) override {
    if (closing_) {
      done(asio::error::operation_aborted);
      return;
    }
    writing_ = true;
    ws_.binary(binary);
    ws_.async_write(data, [self = Self(), done = std::move(done)](error_code ec, size_t) {
      self->writing_ = false;
      done(ec);
      if (self->close_after_write_) self->Shut(self->close_code_, self->close_reason_);
    });
  }

  void Shut(websocket::close_code code, const std::string& reason) override {
    const std::shared_ptr<End> hold = std::move(keep_);
    if (closing_) return;
    waiting_ = false;
    slot_.Enter(net::Stage::kClosing);
    if (!upgraded_) {
      closing_ = true;
      error_code ignored;
      beast::get_lowest_layer(ws_).socket().close(ignored);
      return;
    }
    if (writing_) {  // one write at a time: close once it is done
      close_after_write_ = true;
      close_code_ = code;
      close_reason_ = reason;
      return;
    }
    closing_ = true;
    // The close handshake gets a short grace period; then the socket goes.
    beast::get_lowest_layer(ws_).expires_after(std::chrono::seconds(2));
    ws_.async_close(websocket::close_reason(code, reason), [self = Self()](error_code) {
      error_code ignored;
      beast::get_lowest_layer(self->ws_).socket().close(ignored);
    });
  }

  // Callers hold this end (a handler's `self`, or the server's lock of it): dropping `keep_` here
  // never destroys it under their feet.
  void Kill() override {
    const std::shared_ptr<End> hold = std::move(keep_);
    closing_ = true;
    waiting_ = false;
    error_code ignored;
    beast::get_lowest_layer(ws_).socket().close(ignored);
  }

  void WaitForPartner() override {
    waiting_ = true;
    slot_.Enter(net::Stage::kWaiting);
    // Watch the waiting connection: a client that leaves while waiting frees its role at once.
    ws_.async_read(buf_, [self = Self()](error_code ec, size_t) {
      if (self->partner_.lock() != nullptr) {
        // Paired while this read was pending: it carried the first payload message.
        self->OnRead(ec);
        return;
      }
      if (!ec) {
        // Payload before the partner arrived: keep it and stop reading until paired. No
        // operation holds this end meanwhile, so it holds itself until it is paired or closed.
        self->early_ = true;
        self->keep_ = self;
        return;
      }
      self->waiting_ = false;
      self->srv_->Unregister(self.get());
      self->Shut(websocket::close_code::going_away, "");
    });
    waiting_read_ = true;
  }

 private:
  static constexpr bool kTls = !std::is_same_v<Next, beast::tcp_stream>;

  std::shared_ptr<End> Self() { return std::static_pointer_cast<End>(shared_from_this()); }

  // Gives back this end's place in the reserve of an expected edge.
  void Unreserve() {
    if (!reserved_) return;
    reserved_ = false;
    srv_->Unreserve(edge);
  }

  // Before the WebSocket exists: drop without ceremony.
  void Drop(const std::string& why) {
    if (closing_) return;
    ++srv_->refused;
    slot_.Notify();
    KV_LOG_DEBUG("relay: {} dropped: {}", address, why);
    Kill();
  }

  void HttpRefuse(http::status status, const std::string& why) {
    refusing_ = true;
    ++srv_->refused;
    slot_.Notify();
    slot_.Enter(net::Stage::kClosing);
    KV_LOG_INFO("relay: {} refused ({}): {}", address, static_cast<int>(status), why);
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->set(http::field::server, "kvasir-relay");
    res->set(http::field::content_type, "text/plain");
    res->set(http::field::connection, "close");
    res->body() = why + "\n";
    res->prepare_payload();
    beast::get_lowest_layer(ws_).expires_after(std::chrono::seconds(2));
    http::async_write(ws_.next_layer(), *res,
                      [self = Self(), res](error_code, size_t) { self->Kill(); });
  }

  void ReadRequest() {
    parser_.emplace();
    parser_->header_limit(kMaxRequestHeaderBytes);
    parser_->body_limit(0);
    // The request's own buffer, bounded: an unauthenticated peer holds at most this much.
    http_buf_.emplace(kMaxRequestHeaderBytes + 1024);
    http::async_read(ws_.next_layer(), *http_buf_, *parser_,
                     [self = Self()](error_code ec, size_t) { self->OnRequest(ec); });
  }

  void OnRequest(error_code ec) {
    http_buf_.reset();
    if (closing_) return;
    if (ec) return Drop(fmt::format("no upgrade request: {}", ec.message()));
    auto req = parser_->release();
    parser_.reset();
    UpgradeVerdict verdict = JudgeUpgradeRequest(req);
    if (!verdict.ok()) return HttpRefuse(verdict.refusal, verdict.why);
    edge = std::move(verdict.edge_id);
    // An end for an edge whose other end waits is expected: it goes to the reserve, where the
    // strangers filling the open places cannot evict it.
    if (srv_->Expected(edge) && slot_.Promote()) {
      reserved_ = true;
      ++srv_->edges[edge].expected;
    }
    websocket::stream_base::timeout t;
    const auto remaining =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
    t.handshake_timeout = std::max(remaining, std::chrono::milliseconds(1));
    t.idle_timeout = std::chrono::milliseconds(srv_->o.idle_timeout_ms);
    t.keep_alive_pings = true;
    ws_.set_option(t);
    // Until its token passes, an end may send one message of the hello's size: a larger frame is
    // refused on its header (close 1009), before any of its payload is buffered.
    ws_.read_message_max(kHelloBytes);
    ws_.set_option(websocket::stream_base::decorator(
        [](websocket::response_type& res) { res.set(http::field::server, "kvasir-relay"); }));
    ws_.async_accept(req, [self = Self()](error_code ec) {
      if (self->closing_) return;
      if (ec) return self->Drop(fmt::format("WebSocket handshake failed: {}", ec.message()));
      self->upgraded_ = true;
      self->ws_.async_read(self->buf_, [self](error_code ec, size_t n) { self->OnHello(ec, n); });
    });
  }

  void OnHello(error_code ec, size_t) {
    Unreserve();
    if (closing_) return;
    if (ec == websocket::error::message_too_big) {
      // The stream has already sent close 1009 and dropped the connection.
      ++srv_->refused;
      slot_.Notify();
      KV_LOG_WARN("relay: {} on edge {}: bad preamble: a first message over {} bytes (closed 1009)",
                  address, edge, kHelloBytes);
      return Kill();
    }
    if (ec) return Drop(fmt::format("edge {}: no hello: {}", edge, ec.message()));
    const std::span<const uint8_t> message(static_cast<const uint8_t*>(buf_.data().data()),
                                           buf_.size());
    Result<Role> checked = CheckEdgeHello(srv_->secret(), edge, message, ws_.got_binary());
    buf_.consume(buf_.size());
    if (!checked.ok()) {
      ++srv_->refused;
      slot_.Notify();
      KV_LOG_WARN("relay: {} on edge {}: {}", address, edge, checked.status().message());
      const bool token = checked.status().code() == StatusCode::kUnauthenticated;
      return Shut(websocket::close_code::policy_error, token ? "bad token" : "bad preamble");
    }
    role = *checked;
    // Authenticated: from here on an end may send messages up to the relay's limit, and it waits
    // for its partner in the reserve (when the reserve has room for its address).
    ws_.read_message_max(srv_->o.max_message_bytes);
    slot_.Promote();
    srv_->Register(shared_from_this());
    slot_.Notify();
  }

  void ReadLoop() {
    if (early_) {  // a message read while waiting for the partner
      early_ = false;
      const std::shared_ptr<End> self = std::move(keep_);
      return OnRead(error_code{});
    }
    if (waiting_read_) {  // the read started while waiting is still pending; it continues here
      waiting_read_ = false;
      return;
    }
    ws_.async_read(buf_, [self = Self()](error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(error_code ec) {
    waiting_read_ = false;
    auto partner = partner_.lock();
    if (ec || partner == nullptr || closing_) {
      std::string why = ec ? ec.message() : "partner gone";
      if (ec == websocket::error::closed) why = "closed by the client";
      if (ec == websocket::error::message_too_big) {
        KV_LOG_WARN("relay: edge {}: {} {} sent a message over {} bytes; edge closed", edge,
                    RoleName(role), address, srv_->o.max_message_bytes);
      }
      return EndPair(why);
    }
    srv_->bytes_forwarded += buf_.size();
    slot_.Notify();
    partner->Send(buf_.data(), ws_.got_binary(), [self = Self()](error_code ec) {
      if (ec) return self->EndPair("partner write failed: " + ec.message());
      self->buf_.consume(self->buf_.size());
      self->ReadLoop();
    });
  }

  // This end is finished: free its role and close its partner.
  void EndPair(const std::string& why) {
    srv_->Unregister(this);
    auto partner = partner_.lock();
    partner_.reset();
    if (pairing_ != nullptr && pairing_->active) {
      pairing_->active = false;
      --srv_->edges_active;
      slot_.Notify();
      KV_LOG_INFO("relay: edge {} closed ({} {}: {})", edge, RoleName(role), address, why);
    }
    Shut(websocket::close_code::going_away, "");
    if (partner != nullptr) {
      srv_->Unregister(partner.get());
      partner->Shut(websocket::close_code::going_away, "partner closed");
    }
  }

  std::shared_ptr<Impl> srv_;
  net::ServerSlot slot_;
  websocket::stream<Next> ws_;
  beast::flat_buffer buf_;                      // WebSocket messages
  std::optional<beast::flat_buffer> http_buf_;  // the upgrade request, while it is read
  std::optional<http::request_parser<http::empty_body>> parser_;
  Clock::time_point deadline_;  // the hello's, for the WebSocket handshake's own timeout
  std::weak_ptr<EndBase> partner_;
  std::shared_ptr<Pairing> pairing_;
  std::shared_ptr<End> keep_;  // this end, while it waits for its partner with a message read
  bool upgraded_ = false, closing_ = false, refusing_ = false, waiting_ = false;
  bool reserved_ = false;
  bool writing_ = false, close_after_write_ = false, waiting_read_ = false, early_ = false;
  websocket::close_code close_code_ = websocket::close_code::normal;
  std::string close_reason_;
};

}  // namespace

std::shared_ptr<net::ServerConnection> RelayServer::Impl::Launch(net::Accepted a) {
  if (a.tls == nullptr) {
    return std::make_shared<End<beast::tcp_stream>>(shared_from_this(), std::move(a.slot),
                                                    std::move(a.socket));
  }
  return std::make_shared<End<beast::ssl_stream<beast::tcp_stream>>>(
      shared_from_this(), std::move(a.slot), std::move(a.socket), *a.tls);
}

RelayServer::RelayServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

RelayServer::~RelayServer() { Stop(); }

Result<std::unique_ptr<RelayServer>> RelayServer::Start(const RelayOptions& o) {
  if (!o.secret.empty() && o.secret.size() < kMinSecretBytes) {
    return Error("the ring secret needs at least {} bytes", kMinSecretBytes);
  }
  if (o.max_message_bytes < kHelloBytes) {
    return Error("the largest message ({} bytes) must hold the edge hello ({} bytes)",
                 o.max_message_bytes, kHelloBytes);
  }
  if (o.max_pending_per_address < 1 || o.max_pending_total < 1 || o.max_waiting_per_address < 1 ||
      o.max_waiting_total < 1) {
    return Error(
        "the pending-connection limits must be at least 1 (got {} per address, {} in "
        "all; waiting {} per address, {} in all)",
        o.max_pending_per_address, o.max_pending_total, o.max_waiting_per_address,
        o.max_waiting_total);
  }
  for (int ms :
       {o.hello_timeout_ms, o.pressed_hello_timeout_ms, o.pair_timeout_ms, o.idle_timeout_ms}) {
    if (ms < 1) return Error("the relay's timeouts must be at least 1 ms (got {})", ms);
  }
  auto impl = std::make_shared<Impl>();
  impl->o = o;
  net::ServerOptions so;
  so.name = "relay";
  so.listen = o.listen;
  so.listen_fd = o.listen_fd;
  so.tls_cert = o.tls_cert;
  so.tls_key = o.tls_key;
  so.refusal = "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
  net::AdmissionPolicy& p = so.admission;
  p.open = {o.max_pending_total, o.max_pending_per_address, std::max(1, o.max_pending_total / 2)};
  p.proven = {o.max_waiting_total, o.max_waiting_per_address, std::max(1, o.max_waiting_total / 2)};
  p.timeout(net::Stage::kSilent) = {o.hello_timeout_ms,
                                    std::min(o.pressed_hello_timeout_ms, o.hello_timeout_ms)};
  p.timeout(net::Stage::kWaiting) = {o.pair_timeout_ms, o.pair_timeout_ms};
  // A refusal's answer or close handshake.
  p.timeout(net::Stage::kClosing) = {2000, 2000};
  std::weak_ptr<Impl> weak = impl;
  auto server =
      net::Server::Start(so, [weak](net::Accepted a) -> std::shared_ptr<net::ServerConnection> {
        auto impl = weak.lock();
        return impl ? impl->Launch(std::move(a)) : nullptr;
      });
  if (!server.ok()) return server.status();
  impl->server = std::move(server).value();
  return std::unique_ptr<RelayServer>(new RelayServer(impl));
}

uint16_t RelayServer::port() const { return impl_->server->port(); }
bool RelayServer::tls() const { return impl_->server->tls(); }

RelayStats RelayServer::stats() const {
  const net::ServerStats n = impl_->server->stats();
  RelayStats s;
  s.connections = n.accepted + n.refused;
  s.refused = impl_->refused.load() + n.refused;
  s.edges_paired = impl_->edges_paired.load();
  s.edges_active = impl_->edges_active.load();
  s.bytes_forwarded = impl_->bytes_forwarded.load();
  s.pending = n.open + n.proven;
  s.reserved = n.proven;
  s.evicted = n.evicted;
  return s;
}

bool RelayServer::WaitFor(const std::function<bool(const RelayStats&)>& done,
                          int timeout_ms) const {
  return impl_->server->WaitFor([&] { return done(stats()); }, timeout_ms);
}

void RelayServer::Stop() {
  if (impl_ == nullptr || impl_->server == nullptr) return;
  impl_->server->Stop();
  // Handlers that were still queued are gone with the loop; forget the edges they named.
  impl_->edges.clear();
}

}  // namespace kvasir::relay
