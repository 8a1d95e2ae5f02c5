#include "net/http_server.h"

#include <array>
#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <optional>

#include "base/log.h"

namespace kvasir::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;

struct HttpServer::Shared {
  HttpServerOptions o;
  HttpHandler handler;
  std::atomic<uint64_t> requests{0}, rejected{0}, streams_dropped{0};

  HttpServerResponse ErrorBody(int status, const std::string& code, const std::string& message) {
    if (o.error_body) return o.error_body(status, code, message);
    HttpServerResponse r;
    r.status = status;
    r.body = message + "\n";
    return r;
  }
};

HttpHandler Synchronous(std::function<HttpServerResponse(const HttpServerRequest&)> answer) {
  return [answer = std::move(answer)](HttpServerRequest request, HttpResponder reply) {
    reply(answer(request));
  };
}

void SetHttpTimeouts(AdmissionPolicy* p, int request_timeout_ms, int idle_timeout_ms) {
  p->timeout(Stage::kSilent) = {request_timeout_ms, 1000};
  p->timeout(Stage::kReading) = {request_timeout_ms, 4000};
  p->timeout(Stage::kWriting) = {request_timeout_ms, 4000};
  p->timeout(Stage::kIdle) = {idle_timeout_ms, 1000};
  // After an answer that closes: the client's unread bytes are drained for a second, so the close
  // does not turn into a reset that destroys the answer before the client reads it.
  p->timeout(Stage::kClosing) = {1000, 1000};
  p->timeout(Stage::kWaiting) = {request_timeout_ms, 4000};
  p->timeout(Stage::kHandling) = {};
}

namespace {

template <class Stream>
class HttpConnection final : public ServerConnection,
                             public std::enable_shared_from_this<HttpConnection<Stream>> {
 public:
  template <class... Args>
  HttpConnection(std::shared_ptr<HttpServer::Shared> shared, ServerSlot slot, Args&&... args)
      : shared_(std::move(shared)),
        slot_(std::move(slot)),
        stream_(std::forward<Args>(args)...),
        buf_(shared_->o.max_header_bytes + 1024) {}

  void Start() override {
    if constexpr (kTls) {
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](error_code ec) {
                                if (ec) return self->Drop("TLS handshake failed: " + ec.message());
                                self->slot_.Enter(Stage::kReading, /*restart_clock=*/false);
                                self->ReadHeader();
                              });
    } else {
      AwaitRequest(/*restart_clock=*/false);
    }
  }

  ~HttpConnection() override {
    if (body_) body_->Detach();
  }

  void Close(CloseCause cause) override {
    if (closed_) return;
    KV_LOG_DEBUG("{}: {} closed: {}", shared_->o.server.name, slot_.ip(), CloseCauseName(cause));
    Kill(cause == CloseCause::kDeadline   ? "the client did not read the answer in time"
         : cause == CloseCause::kStopping ? "the server is stopping"
                                          : "the connection was evicted");
  }

 private:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void Kill(const char* why = "the connection closed") {
    closed_ = true;
    error_code ignored;
    Lowest().socket().close(ignored);
    if (body_) {
      // A stream that did not end: its producer learns the client is gone.
      if (!body_finished_) ++shared_->streams_dropped;
      body_->Detach();
      body_->MarkGone(why);
      body_.reset();
    }
  }

  void Drop(const std::string& why) {
    if (closed_) return;
    ++shared_->rejected;
    KV_LOG_DEBUG("{}: {} dropped: {}", shared_->o.server.name, slot_.ip(), why);
    Kill();
  }

  // Waits for the first byte of the next request, then reads it; the deadline is the request's
  // from then on. Over TLS (whose records may hold the next request already) it reads at once.
  void AwaitRequest(bool restart_clock) {
    if (kTls || buf_.size() > 0) {
      slot_.Enter(Stage::kReading, restart_clock);
      return ReadHeader();
    }
    Lowest().socket().async_wait(tcp::socket::wait_read,
                                 [self = this->shared_from_this(), restart_clock](error_code ec) {
                                   if (ec) return self->Kill();
                                   self->slot_.Enter(Stage::kReading, restart_clock);
                                   self->ReadHeader();
                                 });
  }

  void ReadHeader() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(shared_->o.max_header_bytes));
    parser_->body_limit(shared_->o.max_body_bytes);
    http::async_read_header(
        stream_, buf_, *parser_,
        [self = this->shared_from_this()](error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(error_code ec) {
    if (closed_) return;
    if (ec == http::error::end_of_stream || ec == asio::error::eof) return Kill();
    if (ec == http::error::header_limit) {
      return Refuse(431, "too_large",
                    fmt::format("request header over {} bytes", shared_->o.max_header_bytes));
    }
    if (ec == http::error::body_limit) {  // a Content-Length over the limit, seen in the header
      return Refuse(413, "too_large",
                    fmt::format("request body over {} bytes", shared_->o.max_body_bytes));
    }
    if (ec) return Drop("bad request header: " + ec.message());
    if (auto len = parser_->content_length(); len && *len > shared_->o.max_body_bytes) {
      return Refuse(
          413, "too_large",
          fmt::format("request body of {} bytes; at most {}", *len, shared_->o.max_body_bytes));
    }
    http::async_read(
        stream_, buf_, *parser_,
        [self = this->shared_from_this()](error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(error_code ec) {
    if (closed_) return;
    if (ec == http::error::body_limit) {
      return Refuse(413, "too_large",
                    fmt::format("request body over {} bytes", shared_->o.max_body_bytes));
    }
    if (ec) return Drop("bad request: " + ec.message());
    auto& req = parser_->get();
    HttpServerRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    for (const auto& field : req) {
      std::string name(field.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers[name] = std::string(field.value());
    }
    r.body = std::move(req.body());
    r.remote_ip = slot_.ip();
    const bool keep_alive = req.keep_alive();
    parser_.reset();
    slot_.Enter(Stage::kHandling);
    asio::io_context& ioc = slot_.ioc();
    shared_->handler(std::move(r),
                     [self = this->shared_from_this(), &ioc, keep_alive](HttpServerResponse res) {
                       asio::post(ioc, [self, res = std::move(res), keep_alive]() mutable {
                         ++self->shared_->requests;
                         self->Respond(std::move(res), keep_alive);
                       });
                     });
  }

  // Answers without reading the rest of the request, then closes.
  void Refuse(int status, const std::string& code, const std::string& why) {
    ++shared_->rejected;
    Respond(shared_->ErrorBody(status, code, why), /*keep_alive=*/false);
  }

  void Respond(HttpServerResponse a, bool keep_alive) {
    if (closed_) {
      if (a.stream) a.stream->MarkGone("the client went away before the answer began");
      return;
    }
    if (a.proven) slot_.Promote();
    if (a.stream) return RespondStreaming(std::move(a));
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(a.status), 11);
    res->set(http::field::server, shared_->o.server_header);
    res->set(http::field::content_type, a.content_type);
    for (const auto& [name, value] : a.headers) res->set(name, value);
    res->keep_alive(keep_alive);
    res->body() = std::move(a.body);
    res->prepare_payload();
    slot_.Enter(Stage::kWriting);
    http::async_write(stream_, *res,
                      [self = this->shared_from_this(), res, keep_alive](error_code ec, size_t) {
                        if (ec || self->closed_) return self->Kill();
                        if (!keep_alive) return self->Linger();
                        self->slot_.Enter(Stage::kIdle);
                        self->AwaitRequest(/*restart_clock=*/true);
                      });
  }

  // A streamed answer: the head, then chunks as the producer writes them. The connection closes
  // after it, so whatever the client sends meanwhile is read and dropped (Drain), which is also
  // how a client that goes away is noticed at once.
  void RespondStreaming(HttpServerResponse a) {
    std::string head =
        fmt::format("HTTP/1.1 {} {}\r\nServer: {}\r\nContent-Type: {}\r\n", a.status,
                    std::string(http::obsolete_reason(static_cast<http::status>(a.status))),
                    shared_->o.server_header, a.content_type);
    for (const auto& [name, value] : a.headers) head += name + ": " + value + "\r\n";
    head += "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    body_ = std::move(a.stream);
    slot_.Enter(Stage::kWriting);
    auto bytes = std::make_shared<std::string>(std::move(head));
    asio::async_write(stream_, asio::buffer(*bytes),
                      [self = this->shared_from_this(), bytes](error_code ec, size_t) {
                        if (ec || self->closed_)
                          return self->Kill("the client closed the connection");
                        self->Drain();
                        asio::io_context& ioc = self->slot_.ioc();
                        std::weak_ptr<HttpConnection> weak = self;
                        self->body_->Attach([&ioc, weak] {
                          asio::post(ioc, [weak] {
                            if (auto conn = weak.lock()) conn->Pump();
                          });
                        });
                        self->Pump();
                      });
  }

  // Sends what the producer wrote since the last chunk; one write at a time.
  void Pump() {
    if (closed_ || body_ == nullptr || writing_) return;
    if (body_->gone()) return Kill("dropped");
    HttpBodyStream::Taken t = body_->Take();
    if (t.bytes.empty() && !t.ended) {
      slot_.Enter(Stage::kHandling);  // waiting for the producer: no deadline
      return;
    }
    auto out = std::make_shared<std::string>();
    if (!t.bytes.empty()) *out = fmt::format("{:x}\r\n", t.bytes.size()) + t.bytes + "\r\n";
    if (t.ended) *out += "0\r\n\r\n";
    writing_ = true;
    slot_.Enter(Stage::kWriting);
    asio::async_write(
        stream_, asio::buffer(*out),
        [self = this->shared_from_this(), out, ended = t.ended](error_code ec, size_t) {
          self->writing_ = false;
          if (ec || self->closed_) return self->Kill("the client closed the connection");
          if (!ended) return self->Pump();
          self->body_finished_ = true;
          self->body_->Detach();
          // Drain() runs already: close our side and wait for the client's.
          self->slot_.Enter(Stage::kClosing);
          error_code ignored;
          self->Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
        });
  }

  // Closes after an answer: our side first, then whatever the client still sends is read and
  // dropped until the kClosing deadline.
  void Linger() {
    slot_.Enter(Stage::kClosing);
    error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    Drain();
  }
  void Drain() {
    Lowest().async_read_some(asio::buffer(drain_),
                             [self = this->shared_from_this()](error_code ec, size_t) {
                               if (ec) return self->Kill("the client closed the connection");
                               self->Drain();
                             });
  }

  std::shared_ptr<HttpServer::Shared> shared_;
  ServerSlot slot_;
  Stream stream_;
  beast::flat_buffer buf_;  // request bytes, at most the header limit and 1 KiB
  std::array<char, 4096> drain_{};
  std::optional<http::request_parser<http::string_body>> parser_;
  bool closed_ = false;
  // A streamed answer under way (null otherwise), whether a chunk is being written, and whether
  // its last chunk went out.
  std::shared_ptr<HttpBodyStream> body_;
  bool writing_ = false;
  bool body_finished_ = false;
};

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& o,
                                                      HttpHandler handler) {
  auto shared = std::make_shared<Shared>();
  shared->o = o;
  shared->handler = std::move(handler);
  ServerOptions so = o.server;
  if (so.refusal.empty()) {
    const HttpServerResponse busy =
        shared->ErrorBody(503, "unavailable", "too many connections; try again later");
    so.refusal = fmt::format(
        "HTTP/1.1 503 Service Unavailable\r\nServer: {}\r\nContent-Type: {}\r\nConnection: "
        "close\r\nContent-Length: {}\r\n\r\n{}",
        o.server_header, busy.content_type, busy.body.size(), busy.body);
  }
  // Connections hold `shared`; the factory holds it too, until Stop drops the factory.
  auto server = Server::Start(so, [shared](Accepted a) -> std::shared_ptr<ServerConnection> {
    if (a.tls == nullptr) {
      return std::make_shared<HttpConnection<beast::tcp_stream>>(shared, std::move(a.slot),
                                                                 std::move(a.socket));
    }
    return std::make_shared<HttpConnection<beast::ssl_stream<beast::tcp_stream>>>(
        shared, std::move(a.slot), std::move(a.socket), *a.tls);
  });
  if (!server.ok()) return server.status();
  std::unique_ptr<HttpServer> out(new HttpServer());
  out->shared_ = std::move(shared);
  out->server_ = std::move(server).value();
  return out;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (server_) server_->Stop();
}

HttpServerStats HttpServer::stats() const {
  HttpServerStats s;
  s.server = server_->stats();
  s.requests = shared_->requests.load();
  s.rejected = shared_->rejected.load();
  s.streams_dropped = shared_->streams_dropped.load();
  return s;
}

}  // namespace kvasir::net
