#include "relay/relay_server.h"

// <utility> first: Boost 1.74's Asio needs it before its headers under GCC 12 in C++20 mode.
#include <utility>

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <map>
#include <thread>

#include "base/check.h"
#include "base/log.h"
#include "net/stream.h"
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

class EndBase : public std::enable_shared_from_this<EndBase> {
 public:
  virtual ~EndBase() = default;
  // Paired: start reading this end and forwarding to `partner`.
  virtual void StartBridge(std::shared_ptr<EndBase> partner, std::shared_ptr<Pairing> pairing) = 0;
  // Writes one message to this end; `done` runs when it is written (or failed).
  virtual void Send(asio::const_buffer data, bool binary, std::function<void(error_code)> done) = 0;
  // Closes this end with a close frame when it can, else drops the connection.
  virtual void Shut(websocket::close_code code, const std::string& reason) = 0;
  // Drops the connection at once (server stopping).
  virtual void Kill() = 0;
  virtual void WaitForPartner() = 0;

  std::string edge;
  Role role = Role::kPredecessorSide;
  std::string address;
};

}  // namespace

struct RelayServer::Impl : std::enable_shared_from_this<RelayServer::Impl> {
  RelayOptions o;
  asio::io_context ioc;
  std::optional<ssl::context> tls;
  std::optional<tcp::acceptor> acceptor;
  uint16_t port = 0;
  std::thread thread;
  std::atomic<bool> stopping{false};
  bool stopped = false;

  struct Slots {
    std::weak_ptr<EndBase> pred, succ;
  };
  std::map<std::string, Slots> edges;     // by edge id
  std::map<std::string, int> pending;     // not-yet-paired connections by address
  int pending_total = 0;                  // the sum of `pending`
  std::list<std::weak_ptr<EndBase>> ends;  // for Stop()

  std::atomic<uint64_t> connections{0}, refused{0}, edges_paired{0}, edges_active{0},
      bytes_forwarded{0}, pending_now{0};

  void CountPending(const std::string& address) {
    ++pending[address];
    ++pending_total;
    pending_now = static_cast<uint64_t>(pending_total);
  }
  void UncountPending(const std::string& address) {
    auto it = pending.find(address);
    if (it != pending.end() && --it->second <= 0) pending.erase(it);
    --pending_total;
    pending_now = static_cast<uint64_t>(pending_total);
  }

  std::span<const uint8_t> secret() const {
    return {reinterpret_cast<const uint8_t*>(o.secret.data()), o.secret.size()};
  }

  void Accept();
  template <class Next>
  void Launch(tcp::socket socket);

  // Registers an end that passed its hello: pairs it, parks it, or refuses it (role taken).
  void Register(const std::shared_ptr<EndBase>& end) {
    Slots& slots = edges[end->edge];
    std::weak_ptr<EndBase>& mine =
        end->role == Role::kPredecessorSide ? slots.pred : slots.succ;
    std::weak_ptr<EndBase>& theirs =
        end->role == Role::kPredecessorSide ? slots.succ : slots.pred;
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
  void Unregister(const EndBase* end) {
    auto it = edges.find(end->edge);
    if (it == edges.end()) return;
    for (std::weak_ptr<EndBase>* slot : {&it->second.pred, &it->second.succ}) {
      if (auto e = slot->lock(); e.get() == end || e == nullptr) slot->reset();
    }
    if (it->second.pred.expired() && it->second.succ.expired()) edges.erase(it);
  }
};

namespace {

// Where one connection is: the TLS and upgrade handshakes, the hello, waiting for its partner,
// bridging.
template <class Next>
class End final : public EndBase {
 public:
  using Impl = RelayServer::Impl;

  // `next_args` build the layer under the WebSocket: a socket, or a socket and a TLS context.
  template <class... Args>
  End(std::shared_ptr<Impl> srv, std::string address, Args&&... next_args)
      : srv_(std::move(srv)), ws_(std::forward<Args>(next_args)...), timer_(srv_->ioc) {
    this->address = std::move(address);
    deadline_ = Clock::now() + std::chrono::milliseconds(srv_->o.hello_timeout_ms);
  }
  ~End() override { Uncount(); }

  void Run() {
    counted_ = true;
    srv_->CountPending(address);
    if constexpr (kTls) {
      beast::get_lowest_layer(ws_).expires_at(deadline_);
      ws_.next_layer().async_handshake(
          ssl::stream_base::server, [self = Self()](error_code ec) {
            if (ec) return self->Drop(fmt::format("TLS handshake failed: {}", ec.message()));
            self->ReadRequest();
          });
    } else {
      ReadRequest();
    }
  }

  void StartBridge(std::shared_ptr<EndBase> partner, std::shared_ptr<Pairing> pairing) override {
    timer_.cancel();
    Uncount();
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
    if (closing_) return;
    timer_.cancel();
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

  void Kill() override {
    closing_ = true;
    timer_.cancel();
    error_code ignored;
    beast::get_lowest_layer(ws_).socket().close(ignored);
  }

  void WaitForPartner() override {
    timer_.expires_after(std::chrono::milliseconds(srv_->o.pair_timeout_ms));
    timer_.async_wait([self = Self()](error_code ec) {
      if (ec || self->partner_.lock() != nullptr || self->closing_) return;
      ++self->srv_->refused;
      KV_LOG_WARN("relay: edge {}: {} {}: partner did not arrive within {} ms", self->edge,
                  RoleName(self->role), self->address, self->srv_->o.pair_timeout_ms);
      self->srv_->Unregister(self.get());
      self->Shut(websocket::close_code::going_away, "partner did not arrive");
    });
    // Watch the waiting connection: a client that leaves while waiting frees its role at once.
    ws_.async_read(buf_, [self = Self()](error_code ec, size_t) {
      if (self->partner_.lock() != nullptr) {
        // Paired while this read was pending: it carried the first payload message.
        self->OnRead(ec);
        return;
      }
      if (!ec) {
        // Payload before the partner arrived: keep it and stop reading until paired.
        self->early_ = true;
        return;
      }
      self->srv_->Unregister(self.get());
      self->Shut(websocket::close_code::going_away, "");
    });
    waiting_read_ = true;
  }

 private:
  static constexpr bool kTls = !std::is_same_v<Next, beast::tcp_stream>;

  std::shared_ptr<End> Self() { return std::static_pointer_cast<End>(shared_from_this()); }

  void Uncount() {
    if (!counted_) return;
    counted_ = false;
    srv_->UncountPending(address);
  }

  // Before the WebSocket exists: drop without ceremony.
  void Drop(const std::string& why) {
    if (closing_) return;
    ++srv_->refused;
    KV_LOG_INFO("relay: {} dropped: {}", address, why);
    Kill();
  }

  void HttpRefuse(http::status status, const std::string& why) {
    ++srv_->refused;
    KV_LOG_INFO("relay: {} refused ({}): {}", address, static_cast<int>(status), why);
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->set(http::field::server, "kvasir-relay");
    res->set(http::field::content_type, "text/plain");
    res->set(http::field::connection, "close");
    res->body() = why + "\n";
    res->prepare_payload();
    beast::get_lowest_layer(ws_).expires_after(std::chrono::seconds(2));
    http::async_write(ws_.next_layer(), *res, [self = Self(), res](error_code, size_t) {
      self->Kill();
    });
  }

  void ReadRequest() {
    beast::get_lowest_layer(ws_).expires_at(deadline_);
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
    if (ec) {
      return Drop(fmt::format("no upgrade request: {}",
                              ec == beast::error::timeout ? "timed out" : ec.message()));
    }
    auto req = parser_->release();
    parser_.reset();
    UpgradeVerdict verdict = JudgeUpgradeRequest(req);
    if (!verdict.ok()) return HttpRefuse(verdict.refusal, verdict.why);
    edge = std::move(verdict.edge_id);
    beast::get_lowest_layer(ws_).expires_never();
    websocket::stream_base::timeout t;
    const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
    t.handshake_timeout = std::max(remaining, std::chrono::milliseconds(1));
    t.idle_timeout = std::chrono::milliseconds(srv_->o.idle_timeout_ms);
    t.keep_alive_pings = true;
    ws_.set_option(t);
    // Until its token passes, an end may send one message of the hello's size: a larger frame is
    // refused on its header (close 1009), before any of its payload is buffered.
    ws_.read_message_max(kHelloBytes);
    ws_.set_option(websocket::stream_base::decorator([](websocket::response_type& res) {
      res.set(http::field::server, "kvasir-relay");
    }));
    ws_.async_accept(req, [self = Self()](error_code ec) {
      if (ec) return self->Drop(fmt::format("WebSocket handshake failed: {}", ec.message()));
      self->upgraded_ = true;
      self->ReadHello();
    });
  }

  void ReadHello() {
    timer_.expires_at(deadline_);
    timer_.async_wait([self = Self()](error_code ec) {
      if (ec || self->hello_done_) return;
      ++self->srv_->refused;
      KV_LOG_INFO("relay: {} on edge {}: no hello within {} ms; closed", self->address, self->edge,
                  self->srv_->o.hello_timeout_ms);
      self->Kill();
    });
    ws_.async_read(buf_, [self = Self()](error_code ec, size_t n) { self->OnHello(ec, n); });
  }

  void OnHello(error_code ec, size_t) {
    hello_done_ = true;
    timer_.cancel();
    if (ec == websocket::error::message_too_big) {
      // The stream has already sent close 1009 and dropped the connection.
      ++srv_->refused;
      KV_LOG_WARN("relay: {} on edge {}: bad preamble: a first message over {} bytes (closed 1009)",
                  address, edge, kHelloBytes);
      return Kill();
    }
    if (ec) {
      if (!closing_) Drop(fmt::format("edge {}: no hello: {}", edge, ec.message()));
      return;
    }
    const std::span<const uint8_t> message(static_cast<const uint8_t*>(buf_.data().data()),
                                           buf_.size());
    Result<Role> checked = CheckEdgeHello(srv_->secret(), edge, message, ws_.got_binary());
    buf_.consume(buf_.size());
    if (!checked.ok()) {
      ++srv_->refused;
      KV_LOG_WARN("relay: {} on edge {}: {}", address, edge, checked.status().message());
      const bool token = checked.status().code() == StatusCode::kUnauthenticated;
      return Shut(websocket::close_code::policy_error, token ? "bad token" : "bad preamble");
    }
    role = *checked;
    // Authenticated: from here on an end may send messages up to the relay's limit.
    ws_.read_message_max(srv_->o.max_message_bytes);
    srv_->Register(shared_from_this());
  }

  void ReadLoop() {
    if (early_) {  // a message read while waiting for the partner
      early_ = false;
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
      KV_LOG_INFO("relay: edge {} closed ({} {}: {})", edge, RoleName(role), address, why);
    }
    Shut(websocket::close_code::going_away, "");
    if (partner != nullptr) {
      srv_->Unregister(partner.get());
      partner->Shut(websocket::close_code::going_away, "partner closed");
    }
  }

  std::shared_ptr<Impl> srv_;
  websocket::stream<Next> ws_;
  asio::steady_timer timer_;
  beast::flat_buffer buf_;                      // WebSocket messages
  std::optional<beast::flat_buffer> http_buf_;  // the upgrade request, while it is read
  std::optional<http::request_parser<http::empty_body>> parser_;
  Clock::time_point deadline_;
  std::weak_ptr<EndBase> partner_;
  std::shared_ptr<Pairing> pairing_;
  bool counted_ = false, upgraded_ = false, hello_done_ = false, closing_ = false;
  bool writing_ = false, close_after_write_ = false, waiting_read_ = false, early_ = false;
  websocket::close_code close_code_ = websocket::close_code::normal;
  std::string close_reason_;
};

}  // namespace

template <class Next>
void RelayServer::Impl::Launch(tcp::socket socket) {
  error_code ec;
  const auto ep = socket.remote_endpoint(ec);
  // Ring messages are small and latency-bound: no Nagle delay on either side of the bridge.
  socket.set_option(tcp::no_delay(true), ec);
  const std::string address = ec ? "?" : ep.address().to_string();
  ++connections;
  auto it = pending.find(address);
  const bool address_full = it != pending.end() && it->second >= o.max_pending_per_address;
  if (address_full || pending_total >= o.max_pending_total) {
    ++refused;
    if (address_full) {
      KV_LOG_WARN("relay: {}: more than {} connections not yet paired; refused", address,
                  o.max_pending_per_address);
    } else {
      KV_LOG_WARN("relay: {}: more than {} connections in all not yet paired; refused", address,
                  o.max_pending_total);
    }
    static const std::string kBusy =
        "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
    socket.non_blocking(true, ec);
    socket.write_some(asio::buffer(kBusy), ec);
    socket.close(ec);
    return;
  }
  std::shared_ptr<EndBase> end;
  if constexpr (std::is_same_v<Next, beast::tcp_stream>) {
    auto e = std::make_shared<End<beast::tcp_stream>>(shared_from_this(), address, std::move(socket));
    end = e;
    ends.push_back(end);
    e->Run();
  } else {
    auto e = std::make_shared<End<beast::ssl_stream<beast::tcp_stream>>>(
        shared_from_this(), address, std::move(socket), *tls);
    end = e;
    ends.push_back(end);
    e->Run();
  }
  // Forget ends that are gone, so the list does not grow with the connections served.
  ends.remove_if([](const std::weak_ptr<EndBase>& w) { return w.expired(); });
}

void RelayServer::Impl::Accept() {
  acceptor->async_accept(ioc, [self = shared_from_this()](error_code ec, tcp::socket socket) {
    if (self->stopping.load()) return;
    if (!ec) {
      if (self->tls) {
        self->Launch<beast::ssl_stream<beast::tcp_stream>>(std::move(socket));
      } else {
        self->Launch<beast::tcp_stream>(std::move(socket));
      }
    } else {
      KV_LOG_WARN("relay: accept: {}", ec.message());
    }
    self->Accept();
  });
}

RelayServer::RelayServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

RelayServer::~RelayServer() { Stop(); }

Result<std::unique_ptr<RelayServer>> RelayServer::Start(const RelayOptions& o) {
  auto impl = std::make_shared<Impl>();
  impl->o = o;
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return Error("--tls-cert and --tls-key go together (got only {})",
                 o.tls_cert.empty() ? "--tls-key" : "--tls-cert");
  }
  if (!o.secret.empty() && o.secret.size() < kMinSecretBytes) {
    return Error("the ring secret needs at least {} bytes", kMinSecretBytes);
  }
  if (o.max_message_bytes < kHelloBytes) {
    return Error("the largest message ({} bytes) must hold the edge hello ({} bytes)",
                 o.max_message_bytes, kHelloBytes);
  }
  if (o.max_pending_per_address < 1 || o.max_pending_total < 1) {
    return Error("the pending-connection limits must be at least 1 (got {} per address, {} in all)",
                 o.max_pending_per_address, o.max_pending_total);
  }
  if (!o.tls_cert.empty()) {
    impl->tls.emplace(ssl::context::tls_server);
    error_code ec;
    impl->tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                           ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                           ssl::context::no_tlsv1_1);
    impl->tls->use_certificate_chain_file(o.tls_cert, ec);
    if (ec) return Error("{}: cannot load the certificate: {}", o.tls_cert, ec.message());
    impl->tls->use_private_key_file(o.tls_key, ssl::context::pem, ec);
    if (ec) return Error("{}: cannot load the private key: {}", o.tls_key, ec.message());
  }
  impl->acceptor.emplace(impl->ioc);
  tcp::acceptor& acc = *impl->acceptor;
  error_code ec;
  if (o.listen_fd >= 0) {
    const int fd = ::dup(o.listen_fd);
    if (fd < 0) return Error("listening socket {}: {}", o.listen_fd, std::strerror(errno));
    sockaddr_storage sa{};
    socklen_t len = sizeof(sa);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      ::close(fd);
      return Error("listening socket {}: {}", o.listen_fd, std::strerror(errno));
    }
    acc.assign(sa.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), fd, ec);
    if (ec) {
      ::close(fd);
      return Error("listening socket {}: {}", o.listen_fd, ec.message());
    }
  } else {
    std::string host;
    uint16_t port = 0;
    KV_RETURN_IF_ERROR(net::ParseHostPort(o.listen, &host, &port));
    const auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
    if (ec) return Error("--listen {}: '{}' is not an IP address", o.listen, host);
    const tcp::endpoint ep(address, port);
    acc.open(ep.protocol(), ec);
    if (!ec) acc.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acc.bind(ep, ec);
    if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Error("cannot listen on {}: {}", o.listen, ec.message());
  }
  const auto local = acc.local_endpoint(ec);
  if (ec) return Error("listening socket: {}", ec.message());
  impl->port = local.port();
  impl->Accept();
  impl->thread = std::thread([impl] { impl->ioc.run(); });
  return std::unique_ptr<RelayServer>(new RelayServer(impl));
}

uint16_t RelayServer::port() const { return impl_->port; }
bool RelayServer::tls() const { return impl_->tls.has_value(); }

RelayStats RelayServer::stats() const {
  RelayStats s;
  s.connections = impl_->connections.load();
  s.refused = impl_->refused.load();
  s.edges_paired = impl_->edges_paired.load();
  s.edges_active = impl_->edges_active.load();
  s.bytes_forwarded = impl_->bytes_forwarded.load();
  s.pending = impl_->pending_now.load();
  return s;
}

void RelayServer::Stop() {
  if (impl_ == nullptr || impl_->stopped) return;
  impl_->stopped = true;
  impl_->stopping = true;
  asio::post(impl_->ioc, [impl = impl_] {
    error_code ignored;
    impl->acceptor->close(ignored);
    for (auto& w : impl->ends) {
      if (auto e = w.lock()) e->Kill();
    }
  });
  if (impl_->thread.joinable()) impl_->thread.join();
  // Handlers that were still queued hold the Impl; drop them with the loop.
  impl_->ends.clear();
  impl_->edges.clear();
}

}  // namespace kvasir::relay
