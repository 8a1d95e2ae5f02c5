#include "net/http_request.h"

// clang-format off
// <utility> first: Boost 1.74's Asio needs it before its headers under GCC 12 in C++20 mode.
#include <utility>

#include <boost/beast/http.hpp>
#include <chrono>

#include <poll.h>
// clang-format on

#include "net/dial.h"

namespace kvasir::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace ssl = boost::asio::ssl;

struct HttpSession::Impl {
  Url origin;
  HttpRequestOptions options;
  bool keep_alive = true;
  asio::io_context ioc;
  std::unique_ptr<ssl::context> ctx;  // https only
  std::unique_ptr<beast::tcp_stream> plain;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;  // bytes read past an answer (none, from a server that behaves)
  int answered = 0;           // on the current connection
  int connects = 0;

  bool connected() const { return plain != nullptr || tls != nullptr; }
  beast::tcp_stream& Lowest() { return tls ? beast::get_lowest_layer(*tls) : *plain; }

  void Close() {
    if (!connected()) return;
    boost::system::error_code ignored;
    Lowest().socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    Lowest().socket().close(ignored);
    plain.reset();
    tls.reset();
    buffer.clear();
    answered = 0;
  }

  // A kept connection the server has closed (or on which it sent something unasked) reads as
  // ready: it is dropped before a request is written to it.
  bool StillOpen() {
    pollfd p{Lowest().socket().native_handle(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 0 && buffer.size() == 0;
  }

  Status Connect(const IoLimits& limits) {
    if (origin.tls()) {
      tls = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(ioc, *ctx);
    } else {
      plain = std::make_unique<beast::tcp_stream>(ioc);
    }
    ++connects;
    Status s = ConnectTcp(ioc, Lowest(), origin, limits);
    if (s.ok() && tls) s = HandshakeTls(ioc, *tls, origin, limits);
    if (!s.ok()) Close();
    return s;
  }
};

HttpSession::HttpSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpSession::~HttpSession() { impl_->Close(); }
bool HttpSession::connected() const { return impl_->connected(); }
int HttpSession::answered_on_connection() const { return impl_->answered; }
int HttpSession::connects() const { return impl_->connects; }
void HttpSession::Close() { impl_->Close(); }

Result<std::unique_ptr<HttpSession>> HttpSession::Create(const Url& origin,
                                                         const HttpRequestOptions& options,
                                                         bool keep_alive) {
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  impl->options = options;
  impl->keep_alive = keep_alive;
  if (origin.tls()) {
    KV_ASSIGN_OR_RETURN(impl->ctx, MakeTlsClientContext(options.ca_file));
  }
  return std::unique_ptr<HttpSession>(new HttpSession(std::move(impl)));
}

Result<HttpReply> HttpSession::Send(const std::string& method, const std::string& target,
                                    const std::map<std::string, std::string>& headers,
                                    const std::string& body, bool* unanswered) {
  Impl& s = *impl_;
  if (unanswered != nullptr) *unanswered = false;
  Url url = s.origin;
  url.target = target;
  http::verb verb = http::string_to_verb(method);
  if (verb == http::verb::unknown) return Error("HTTP method '{}' is not known", method);
  const IoLimits limits{
      std::chrono::steady_clock::now() + std::chrono::milliseconds(s.options.timeout_ms),
      s.options.cancelled};
  if (s.connected() && !s.StillOpen()) s.Close();
  const bool reused = s.connected();
  if (!reused) KV_RETURN_IF_ERROR(s.Connect(limits));
  auto fail = [&](const char* what, const boost::system::error_code& ec) {
    s.Close();
    const StatusCode code =
        ec == asio::error::timed_out ? StatusCode::kTimeout : StatusCode::kUnavailable;
    return Error(code, "{}: {}: {}", url.ToString(), what, DescribeIoError(ec));
  };

  http::request<http::string_body> req(verb, target, 11);
  req.set(http::field::host, url.Authority());
  req.set(http::field::user_agent, "kvasir");
  for (const auto& [k, v] : headers) req.set(k, v);
  if (!body.empty()) {
    if (req.find(http::field::content_type) == req.end()) {
      req.set(http::field::content_type, "application/json");
    }
    req.body() = body;
  }
  req.keep_alive(s.keep_alive);
  req.prepare_payload();
  auto abort = [&] { s.Lowest().cancel(); };
  auto ec = RunIo(
      s.ioc,
      [&](auto handler) {
        if (s.tls)
          http::async_write(*s.tls, req, std::move(handler));
        else
          http::async_write(*s.plain, req, std::move(handler));
      },
      limits, abort);
  if (ec) {
    if (reused && unanswered != nullptr && ec != asio::error::timed_out &&
        ec != asio::error::operation_aborted) {
      *unanswered = true;
    }
    return fail("sending the request", ec);
  }

  http::response_parser<http::string_body> parser;
  parser.header_limit(64 * 1024);
  parser.body_limit(s.options.max_body_bytes);
  ec = RunIo(
      s.ioc,
      [&](auto handler) {
        if (s.tls)
          http::async_read(*s.tls, s.buffer, parser, std::move(handler));
        else
          http::async_read(*s.plain, s.buffer, parser, std::move(handler));
      },
      limits, abort);
  if (ec == http::error::body_limit) {
    s.Close();
    return Error(StatusCode::kTooLarge, "{}: response over {} bytes", url.ToString(),
                 s.options.max_body_bytes);
  }
  if (ec) {
    // Closed (end of stream, reset) before any byte of an answer on a kept connection.
    if (reused && unanswered != nullptr && !parser.got_some() && s.buffer.size() == 0 &&
        ec != asio::error::timed_out && ec != asio::error::operation_aborted) {
      *unanswered = true;
    }
    return fail("reading the response", ec);
  }
  HttpReply reply;
  reply.status = static_cast<int>(parser.get().result_int());
  reply.content_type = std::string(parser.get()[http::field::content_type]);
  reply.body = std::move(parser.get().body());
  ++s.answered;
  if (!s.keep_alive || !parser.get().keep_alive()) s.Close();
  return reply;
}

Result<HttpReply> HttpRequest(const std::string& method, const std::string& url_text,
                              const std::map<std::string, std::string>& headers,
                              const std::string& body, const HttpRequestOptions& options) {
  KV_ASSIGN_OR_RETURN(Url url, ParseUrl(url_text));
  KV_ASSIGN_OR_RETURN(auto session, HttpSession::Create(url, options, /*keep_alive=*/false));
  return session->Send(method, url.target, headers, body);
}

}  // namespace kvasir::net
