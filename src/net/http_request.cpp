#include "net/http_request.h"

// <utility> first: Boost 1.74's Asio needs it before its headers under GCC 12 in C++20 mode.
#include <utility>

#include <boost/beast/http.hpp>
#include <chrono>

#include "net/dial.h"
#include "net/url.h"

namespace kvasir::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace ssl = boost::asio::ssl;

Result<HttpReply> HttpRequest(const std::string& method, const std::string& url_text,
                              const std::map<std::string, std::string>& headers,
                              const std::string& body, const HttpRequestOptions& options) {
  KV_ASSIGN_OR_RETURN(Url url, ParseUrl(url_text));
  const IoLimits limits{std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(options.timeout_ms),
                        options.cancelled};
  asio::io_context ioc;
  std::unique_ptr<ssl::context> ctx;
  std::unique_ptr<beast::tcp_stream> plain;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls;
  if (url.tls()) {
    KV_ASSIGN_OR_RETURN(ctx, MakeTlsClientContext(options.ca_file));
    tls = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(ioc, *ctx);
  } else {
    plain = std::make_unique<beast::tcp_stream>(ioc);
  }
  beast::tcp_stream& lowest = tls ? beast::get_lowest_layer(*tls) : *plain;
  KV_RETURN_IF_ERROR(ConnectTcp(ioc, lowest, url, limits));
  if (tls) KV_RETURN_IF_ERROR(HandshakeTls(ioc, *tls, url, limits));
  auto fail = [&](const char* what, const boost::system::error_code& ec) {
    const StatusCode code =
        ec == asio::error::timed_out ? StatusCode::kTimeout : StatusCode::kUnavailable;
    return Error(code, "{}: {}: {}", url.ToString(), what, DescribeIoError(ec));
  };

  http::verb verb = http::string_to_verb(method);
  if (verb == http::verb::unknown) return Error("HTTP method '{}' is not known", method);
  http::request<http::string_body> req(verb, url.target, 11);
  req.set(http::field::host, url.Authority());
  req.set(http::field::user_agent, "kvasir");
  for (const auto& [k, v] : headers) req.set(k, v);
  if (!body.empty()) {
    if (req.find(http::field::content_type) == req.end()) {
      req.set(http::field::content_type, "application/json");
    }
    req.body() = body;
  }
  req.keep_alive(false);
  req.prepare_payload();
  auto abort = [&] { lowest.cancel(); };
  auto ec = RunIo(
      ioc,
      [&](auto handler) {
        if (tls) http::async_write(*tls, req, std::move(handler));
        else http::async_write(*plain, req, std::move(handler));
      },
      limits, abort);
  if (ec) return fail("sending the request", ec);

  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.header_limit(64 * 1024);
  parser.body_limit(options.max_body_bytes);
  ec = RunIo(
      ioc,
      [&](auto handler) {
        if (tls) http::async_read(*tls, buffer, parser, std::move(handler));
        else http::async_read(*plain, buffer, parser, std::move(handler));
      },
      limits, abort);
  if (ec == http::error::body_limit) {
    return Error(StatusCode::kTooLarge, "{}: response over {} bytes", url.ToString(),
                 options.max_body_bytes);
  }
  if (ec) return fail("reading the response", ec);
  HttpReply reply;
  reply.status = static_cast<int>(parser.get().result_int());
  reply.content_type = std::string(parser.get()[http::field::content_type]);
  reply.body = std::move(parser.get().body());
  boost::system::error_code ignored;
  lowest.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  return reply;
}

}  // namespace kvasir::net
