#include "market/market_server.h"

// <utility> first: Boost 1.74's Asio needs it before its headers under GCC 12 in C++20 mode.
#include <utility>

#include <array>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <list>
#include <map>
#include <optional>
#include <thread>

#include "base/log.h"
#include "net/stream.h"

namespace kvasir::market {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;

constexpr size_t kMaxHeaderBytes = 8 * 1024;

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {
class ConnBase {
 public:
  virtual ~ConnBase() = default;
  virtual void Kill() = 0;
};
}  // namespace

struct MarketServer::Impl : std::enable_shared_from_this<MarketServer::Impl> {
  MarketServerOptions o;
  MarketApi* api = nullptr;
  asio::io_context ioc;
  std::optional<ssl::context> tls;
  std::optional<tcp::acceptor> acceptor;
  uint16_t port = 0;
  std::thread thread;
  std::atomic<bool> stopping{false};
  bool stopped = false;
  std::map<std::string, int> per_address;
  int open = 0;
  std::list<std::weak_ptr<ConnBase>> conns;
  std::atomic<uint64_t> connections{0}, requests{0}, refused{0};

  void Accept();
  template <class Stream>
  void Launch(tcp::socket socket, const std::string& address);
};

namespace {

template <class Stream>
class Conn final : public ConnBase, public std::enable_shared_from_this<Conn<Stream>> {
 public:
  using Impl = MarketServer::Impl;
  template <class... Args>
  Conn(std::shared_ptr<Impl> srv, std::string address, Args&&... args)
      : srv_(std::move(srv)), address_(std::move(address)), stream_(std::forward<Args>(args)...) {}
  ~Conn() override {
    if (auto it = srv_->per_address.find(address_); it != srv_->per_address.end()) {
      if (--it->second <= 0) srv_->per_address.erase(it);
    }
    --srv_->open;
  }

  void Run() {
    if constexpr (kTls) {
      Lowest().expires_after(std::chrono::milliseconds(srv_->o.request_timeout_ms));
      stream_.async_handshake(ssl::stream_base::server, [self = this->shared_from_this()](error_code ec) {
        if (ec) return self->Drop("TLS handshake failed: " + ec.message());
        self->ReadHeader(true);
      });
    } else {
      ReadHeader(true);
    }
  }

  // Answers without reading the request (limits), then closes.
  void RefuseAndClose(int status, const std::string& code, const std::string& why) {
    ++srv_->refused;
    Respond(ErrorResponse(status, code, why), /*keep_alive=*/false);
  }

  void Kill() override {
    error_code ignored;
    Lowest().socket().close(ignored);
  }

 private:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void Drop(const std::string& why) {
    ++srv_->refused;
    KV_LOG_DEBUG("market: {} dropped: {}", address_, why);
    Kill();
  }

  void ReadHeader(bool first) {
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(kMaxRequestBytes);
    Lowest().expires_after(std::chrono::milliseconds(first ? srv_->o.request_timeout_ms
                                                           : srv_->o.idle_timeout_ms));
    http::async_read_header(stream_, buf_, *parser_,
                            [self = this->shared_from_this()](error_code ec, size_t) {
                              self->OnHeader(ec);
                            });
  }

  void OnHeader(error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof) return Kill();
    if (ec == http::error::header_limit) {
      return RefuseAndClose(431, "too_large", "request header over 8 KiB");
    }
    if (ec == http::error::body_limit) {  // a Content-Length over the limit, seen in the header
      return RefuseAndClose(413, "too_large",
                            fmt::format("request body over {} bytes", kMaxRequestBytes));
    }
    if (ec) return Drop("bad request header: " + ec.message());
    if (auto len = parser_->content_length(); len && *len > kMaxRequestBytes) {
      return RefuseAndClose(413, "too_large",
                            fmt::format("request body of {} bytes; at most {}", *len,
                                        kMaxRequestBytes));
    }
    Lowest().expires_after(std::chrono::milliseconds(srv_->o.request_timeout_ms));
    http::async_read(stream_, buf_, *parser_,
                     [self = this->shared_from_this()](error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(error_code ec) {
    if (ec == http::error::body_limit) {
      return RefuseAndClose(413, "too_large",
                            fmt::format("request body over {} bytes", kMaxRequestBytes));
    }
    if (ec) return Drop("bad request: " + ec.message());
    auto& req = parser_->get();
    ApiRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    for (const auto& field : req) {
      std::string name(field.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers[name] = std::string(field.value());
    }
    r.body = std::move(req.body());
    error_code ignored;
    const auto remote = Lowest().socket().remote_endpoint(ignored);
    r.remote_ip = ignored ? std::string() : remote.address().to_string();
    const bool keep_alive = req.keep_alive();
    ApiResponse res = srv_->api->Handle(r, UnixNow());
    ++srv_->requests;
    KV_LOG_DEBUG("market: {} {} {} -> {}", address_, r.method, r.target.substr(0, 80), res.status);
    Respond(res, keep_alive);
  }

  void Respond(const ApiResponse& a, bool keep_alive) {
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(a.status), 11);
    res->set(http::field::server, "kvasir-market");
    res->set(http::field::content_type, a.content_type);
    res->set(http::field::cache_control, "no-store");
    if (!a.allow.empty()) res->set(http::field::allow, a.allow);
    res->keep_alive(keep_alive);
    res->body() = a.body;
    res->prepare_payload();
    Lowest().expires_after(std::chrono::milliseconds(srv_->o.request_timeout_ms));
    http::async_write(stream_, *res,
                      [self = this->shared_from_this(), res, keep_alive](error_code ec, size_t) {
                        if (ec || self->srv_->stopping.load()) return self->Kill();
                        if (!keep_alive) return self->Linger();
                        self->ReadHeader(false);
                      });
  }

  // Closes after an answer: our side first, then whatever the client still sends is read and
  // dropped for up to a second, so unread request bytes do not turn the close into a reset that
  // would destroy the answer before the client reads it.
  void Linger() {
    error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    Lowest().expires_after(std::chrono::seconds(1));
    Drain();
  }
  void Drain() {
    Lowest().async_read_some(asio::buffer(drain_),
                             [self = this->shared_from_this()](error_code ec, size_t) {
                               if (ec) return self->Kill();
                               self->Drain();
                             });
  }

  std::shared_ptr<Impl> srv_;
  std::string address_;
  Stream stream_;
  beast::flat_buffer buf_{kMaxHeaderBytes + 1024};
  std::array<char, 4096> drain_{};
  std::optional<http::request_parser<http::string_body>> parser_;
};

}  // namespace

template <class Stream>
void MarketServer::Impl::Launch(tcp::socket socket, const std::string& address) {
  std::shared_ptr<Conn<Stream>> c;
  if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
    c = std::make_shared<Conn<Stream>>(shared_from_this(), address, std::move(socket));
  } else {
    c = std::make_shared<Conn<Stream>>(shared_from_this(), address, std::move(socket), *tls);
  }
  ++open;
  const int mine = ++per_address[address];
  conns.push_back(c);
  conns.remove_if([](const std::weak_ptr<ConnBase>& w) { return w.expired(); });
  if (open > o.max_connections || mine > o.max_connections_per_address) {
    KV_LOG_WARN("market: {} refused: {} connections open ({} from it)", address, open, mine);
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      c->RefuseAndClose(503, "unavailable", "too many connections; try again later");
    } else {
      ++refused;
      c->Kill();
    }
    return;
  }
  c->Run();
}

void MarketServer::Impl::Accept() {
  acceptor->async_accept(ioc, [self = shared_from_this()](error_code ec, tcp::socket socket) {
    if (self->stopping.load()) return;
    if (!ec) {
      ++self->connections;
      error_code e2;
      const auto remote = socket.remote_endpoint(e2);
      const std::string address = e2 ? "?" : remote.address().to_string();
      socket.set_option(tcp::no_delay(true), e2);
      if (self->tls) {
        self->Launch<beast::ssl_stream<beast::tcp_stream>>(std::move(socket), address);
      } else {
        self->Launch<beast::tcp_stream>(std::move(socket), address);
      }
    } else {
      KV_LOG_WARN("market: accept: {}", ec.message());
    }
    self->Accept();
  });
}

MarketServer::~MarketServer() { Stop(); }

Result<std::unique_ptr<MarketServer>> MarketServer::Start(const MarketServerOptions& o,
                                                          MarketApi* api) {
  auto impl = std::make_shared<Impl>();
  impl->o = o;
  impl->api = api;
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return Error("--tls-cert and --tls-key go together (got only {})",
                 o.tls_cert.empty() ? "--tls-key" : "--tls-cert");
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
  std::string host;
  uint16_t port = 0;
  KV_RETURN_IF_ERROR(net::ParseHostPort(o.listen, &host, &port));
  error_code ec;
  const auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return Error("--listen {}: '{}' is not an IP address", o.listen, host);
  impl->acceptor.emplace(impl->ioc);
  tcp::acceptor& acc = *impl->acceptor;
  const tcp::endpoint ep(address, port);
  acc.open(ep.protocol(), ec);
  if (!ec) acc.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acc.bind(ep, ec);
  if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Error("cannot listen on {}: {}", o.listen, ec.message());
  impl->port = acc.local_endpoint(ec).port();
  impl->Accept();
  impl->thread = std::thread([impl] { impl->ioc.run(); });
  return std::unique_ptr<MarketServer>(new MarketServer(impl));
}

uint16_t MarketServer::port() const { return impl_->port; }

MarketServerStats MarketServer::stats() const {
  return {impl_->connections.load(), impl_->requests.load(), impl_->refused.load()};
}

void MarketServer::Stop() {
  if (impl_ == nullptr || impl_->stopped) return;
  impl_->stopped = true;
  impl_->stopping = true;
  asio::post(impl_->ioc, [impl = impl_] {
    error_code ignored;
    impl->acceptor->close(ignored);
    for (auto& w : impl->conns) {
      if (auto c = w.lock()) c->Kill();
    }
  });
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->conns.clear();
}

}  // namespace kvasir::market
