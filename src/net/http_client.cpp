#include "net/http_client.h"

// <utility> first: Boost 1.74's Asio needs it before its headers under GCC 12 in C++20 mode.
#include <utility>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <charconv>
#include <chrono>
#include <limits>
#include <optional>
#include <vector>

#include "base/check.h"

namespace kvasir::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr size_t kBodyBuffer = size_t{256} << 10;
constexpr const char* kUserAgent = "kvasir-fetch/0.1";

bool ParseU64(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

bool IsIpLiteral(const std::string& host) {
  error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

std::string Describe(const error_code& ec) {
  if (ec == beast::error::timeout) return "timed out";
  return ec.message();
}

}  // namespace

bool ParseContentRange(std::string_view value, uint64_t* first, uint64_t* last, uint64_t* total) {
  if (value.rfind("bytes ", 0) != 0) return false;
  value.remove_prefix(6);
  const size_t dash = value.find('-');
  const size_t slash = value.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || dash > slash) {
    return false;
  }
  if (!ParseU64(value.substr(0, dash), first)) return false;
  if (!ParseU64(value.substr(dash + 1, slash - dash - 1), last)) return false;
  std::string_view t = value.substr(slash + 1);
  if (t == "*") {
    *total = 0;
  } else if (!ParseU64(t, total) || *last >= *total) {
    return false;
  }
  return *first <= *last;
}

struct HttpClient::Impl {
  asio::io_context ioc;
  std::optional<ssl::context> tls_ctx;
  std::unique_ptr<beast::tcp_stream> plain;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;
  std::string connected_to;  // Authority() of the open connection, empty when closed

  beast::tcp_stream& lowest() { return tls ? beast::get_lowest_layer(*tls) : *plain; }

  // Runs one asynchronous operation to completion on this thread. Socket operations carry their
  // own deadline (tcp_stream::expires_after); `limit` bounds everything else (name lookup).
  template <class Start>
  error_code Run(Start&& start, std::chrono::milliseconds limit, const std::function<void()>& cancel) {
    error_code result;
    bool done = false;
    start([&](error_code ec, auto&&...) {
      result = ec;
      done = true;
    });
    ioc.restart();
    ioc.run_for(limit);
    if (!done) {
      cancel();
      ioc.restart();
      ioc.run();
      if (!done) return asio::error::timed_out;
      if (!result) result = beast::error::timeout;
    }
    return result;
  }

  void Close() {
    error_code ignored;
    if (tls) beast::get_lowest_layer(*tls).socket().close(ignored);
    if (plain) plain->socket().close(ignored);
    tls.reset();
    plain.reset();
    buffer.clear();
    connected_to.clear();
  }
};

HttpClient::HttpClient(Url url, HttpOptions options, std::unique_ptr<Impl> impl)
    : url_(std::move(url)), options_(std::move(options)), impl_(std::move(impl)) {}

HttpClient::~HttpClient() {
  if (impl_) impl_->Close();
}

Result<std::unique_ptr<HttpClient>> HttpClient::Create(const Url& url, const HttpOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->tls_ctx.emplace(ssl::context::tls_client);
  ssl::context& ctx = *impl->tls_ctx;
  error_code ec;
  ctx.set_verify_mode(ssl::verify_peer, ec);
  if (!options.ca_file.empty()) {
    ctx.load_verify_file(options.ca_file, ec);
    if (ec) {
      return Error("{}: cannot load CA certificates: {}", options.ca_file, ec.message());
    }
  } else {
    ctx.set_default_verify_paths(ec);
    if (ec) return Error("cannot load the system's CA certificates: {}", ec.message());
  }
  return std::unique_ptr<HttpClient>(new HttpClient(url, options, std::move(impl)));
}

void HttpClient::Close() { impl_->Close(); }

Status HttpClient::Fail(HttpFailure kind, Status status) {
  failure_ = kind;
  impl_->Close();
  return status;
}

Status HttpClient::GetRange(uint64_t offset, uint64_t length, bool clamp_at_eof,
                            const BodySink& sink, RangeReply* reply) {
  KV_CHECK(length > 0);
  failure_ = HttpFailure::kNone;
  for (int hop = 0;; ++hop) {
    std::string redirect;
    *reply = RangeReply{};
    const bool reused = !impl_->connected_to.empty();
    Status s = RequestOnce(offset, length, clamp_at_eof, sink, reply, &redirect);
    // A kept-alive connection the server has since closed fails before any reply byte: that is
    // not a failure of the server, so try once more on a fresh connection.
    if (!s.ok() && reused && failure_ == HttpFailure::kNetwork && reply->received == 0 &&
        !stale_retry_used_) {
      stale_retry_used_ = true;
      *reply = RangeReply{};
      s = RequestOnce(offset, length, clamp_at_eof, sink, reply, &redirect);
    }
    stale_retry_used_ = false;
    if (!s.ok() || redirect.empty()) return s;
    if (hop >= options_.max_redirects) {
      return Fail(HttpFailure::kRefused,
                  Error("{}: more than {} redirects", url_.ToString(), options_.max_redirects));
    }
    auto next = ResolveLocation(url_, redirect);
    if (!next.ok()) return Fail(HttpFailure::kRefused, next.status());
    if (url_.tls() && !next->tls()) {
      return Fail(HttpFailure::kRefused,
                  Error("{}: refusing a redirect from https to {}", url_.ToString(),
                        next->ToString()));
    }
    url_ = *next;
  }
}

Status HttpClient::RequestOnce(uint64_t offset, uint64_t length, bool clamp_at_eof,
                               const BodySink& sink, RangeReply* reply, std::string* redirect) {
  Impl& im = *impl_;
  const std::string where = url_.ToString();
  const auto connect_limit = std::chrono::milliseconds(options_.connect_timeout_ms);
  const auto io_limit = std::chrono::milliseconds(options_.io_timeout_ms);
  // A generous outer bound: the socket deadline fires first.
  const auto outer = io_limit + std::chrono::seconds(5);

  if (im.connected_to != url_.Authority() || (!im.plain && !im.tls)) {
    im.Close();
    tcp::resolver resolver(im.ioc);
    tcp::resolver::results_type endpoints;
    error_code ec = im.Run(
        [&](auto handler) {
          resolver.async_resolve(url_.host, std::to_string(url_.port),
                                 [&, handler](error_code e, tcp::resolver::results_type r) mutable {
                                   endpoints = std::move(r);
                                   handler(e);
                                 });
        },
        connect_limit, [&] { resolver.cancel(); });
    if (ec) {
      return Fail(HttpFailure::kNetwork,
                  Error("{}: cannot resolve host {}: {}", where, url_.host, Describe(ec)));
    }
    if (url_.tls()) {
      im.tls = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(im.ioc, *im.tls_ctx);
    } else {
      im.plain = std::make_unique<beast::tcp_stream>(im.ioc);
    }
    beast::tcp_stream& sock = im.lowest();
    sock.expires_after(connect_limit);
    ec = im.Run([&](auto handler) { sock.async_connect(endpoints, std::move(handler)); },
                connect_limit + std::chrono::seconds(5), [&] { sock.cancel(); });
    if (ec) {
      return Fail(HttpFailure::kNetwork,
                  Error("{}: cannot connect to {}: {}", where, url_.Authority(), Describe(ec)));
    }
    error_code ignored;
    sock.socket().set_option(tcp::no_delay(true), ignored);
    if (url_.tls()) {
      if (!IsIpLiteral(url_.host) &&
          !SSL_set_tlsext_host_name(im.tls->native_handle(), url_.host.c_str())) {
        return Fail(HttpFailure::kRefused, Error("{}: cannot set TLS server name", where));
      }
      im.tls->set_verify_callback(ssl::host_name_verification(url_.host));
      sock.expires_after(connect_limit);
      ec = im.Run(
          [&](auto handler) { im.tls->async_handshake(ssl::stream_base::client, std::move(handler)); },
          connect_limit + std::chrono::seconds(5), [&] { sock.cancel(); });
      if (ec) {
        // A certificate that does not verify will not verify on a second try either.
        const bool cert = ec.category() == asio::error::get_ssl_category();
        return Fail(cert ? HttpFailure::kRefused : HttpFailure::kNetwork,
                    Error("{}: TLS handshake failed: {}{}", where, Describe(ec),
                          cert ? " (use --ca FILE to trust a private certificate authority)"
                               : ""));
      }
    }
    im.connected_to = url_.Authority();
  }

  http::request<http::empty_body> req{http::verb::get, url_.target, 11};
  req.set(http::field::host, url_.port == (url_.tls() ? 443 : 80) ? url_.host : url_.Authority());
  req.set(http::field::user_agent, kUserAgent);
  req.set(http::field::accept_encoding, "identity");
  req.set(http::field::range, "bytes=" + std::to_string(offset) + "-" +
                                  std::to_string(offset + length - 1));
  ++requests_;
  im.lowest().expires_after(io_limit);
  error_code ec = im.Run(
      [&](auto handler) {
        if (im.tls) {
          http::async_write(*im.tls, req, std::move(handler));
        } else {
          http::async_write(*im.plain, req, std::move(handler));
        }
      },
      outer, [&] { im.lowest().cancel(); });
  if (ec) {
    return Fail(HttpFailure::kNetwork, Error("{}: sending the request failed: {}", where,
                                             Describe(ec)));
  }

  // Beast reads at most the buffer's free capacity per call: a large one keeps system calls few.
  im.buffer.reserve(kBodyBuffer);
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  parser.header_limit(64 * 1024);
  im.lowest().expires_after(io_limit);
  ec = im.Run(
      [&](auto handler) {
        if (im.tls) {
          http::async_read_header(*im.tls, im.buffer, parser, std::move(handler));
        } else {
          http::async_read_header(*im.plain, im.buffer, parser, std::move(handler));
        }
      },
      outer, [&] { im.lowest().cancel(); });
  if (ec) {
    // A reply that is not valid HTTP will not become valid on a second try.
    const bool garbage = ec.category() == http::make_error_code(http::error::bad_version).category();
    return Fail(garbage ? HttpFailure::kRefused : HttpFailure::kNetwork,
                Error("{}: reading the response header failed: {}", where, Describe(ec)));
  }
  const auto& head = parser.get();
  const unsigned status = head.result_int();
  reply->etag = std::string(head[http::field::etag]);
  reply->last_modified = std::string(head[http::field::last_modified]);
  if (status == 301 || status == 302 || status == 303 || status == 307 || status == 308) {
    auto loc = head[http::field::location];
    if (loc.empty()) {
      return Fail(HttpFailure::kRefused,
                  Error("{}: redirect {} without a Location header", where, status));
    }
    *redirect = std::string(loc);
    im.Close();
    return Status::Ok();
  }
  if (status == 200) {
    return Fail(HttpFailure::kRefused,
                Error("{}: the server ignored the Range request (it answered 200 with the whole "
                      "file instead of 206 with bytes {}-{}); kvasir fetch needs a server that "
                      "honours HTTP Range requests",
                      where, offset, offset + length - 1));
  }
  if (status == 416) {
    return Fail(HttpFailure::kRefused,
                Error("{}: bytes {}-{} are past the end of the file (416 Range Not Satisfiable, "
                      "Content-Range: {}); the file on the server is shorter than expected",
                      where, offset, offset + length - 1,
                      std::string(head[http::field::content_range])));
  }
  if (status == 408 || status == 429 || status >= 500) {
    return Fail(HttpFailure::kServerBusy,
                Error("{}: server answered {} {}", where, status, std::string(head.reason())));
  }
  if (status != 206) {
    return Fail(HttpFailure::kRefused,
                Error("{}: server answered {} {}", where, status, std::string(head.reason())));
  }
  const std::string content_range(head[http::field::content_range]);
  uint64_t first = 0, last = 0, total = 0;
  if (!ParseContentRange(content_range, &first, &last, &total)) {
    return Fail(HttpFailure::kRefused,
                Error("{}: 206 reply with a missing or malformed Content-Range '{}' (asked for bytes "
                      "{}-{}; multi-range replies are not supported)",
                      where, content_range, offset, offset + length - 1));
  }
  const uint64_t want_last = offset + length - 1;
  const bool clamped = clamp_at_eof && total != 0 && last == total - 1 && last < want_last;
  if (first != offset || (last != want_last && !clamped)) {
    return Fail(HttpFailure::kRefused,
                Error("{}: asked for bytes {}-{}, the server sent '{}'", where, offset, want_last,
                      content_range));
  }
  reply->first = first;
  reply->last = last;
  reply->total_size = total;
  const uint64_t expect = last - first + 1;
  if (auto cl = head.payload_size(); cl && *cl != expect) {
    return Fail(HttpFailure::kRefused,
                Error("{}: Content-Length {} does not match Content-Range '{}'", where, *cl,
                      content_range));
  }

  std::vector<uint8_t> buf(kBodyBuffer);
  while (!parser.is_done()) {
    parser.get().body().data = buf.data();
    parser.get().body().size = buf.size();
    im.lowest().expires_after(io_limit);
    ec = im.Run(
        [&](auto handler) {
          if (im.tls) {
            http::async_read_some(*im.tls, im.buffer, parser, std::move(handler));
          } else {
            http::async_read_some(*im.plain, im.buffer, parser, std::move(handler));
          }
        },
        outer, [&] { im.lowest().cancel(); });
    if (ec == http::error::need_buffer) ec = {};
    const size_t n = buf.size() - parser.get().body().size;
    if (n > 0) {
      if (reply->received + n > expect) {
        return Fail(HttpFailure::kRefused,
                    Error("{}: body longer than Content-Range '{}'", where, content_range));
      }
      if (Status s = sink(std::span<const uint8_t>(buf.data(), n)); !s.ok()) {
        return Fail(HttpFailure::kRefused, s);
      }
      reply->received += n;
    }
    if (ec) {
      const bool cut = ec == http::error::partial_message || ec == http::error::end_of_stream ||
                       ec == asio::error::eof || ec == asio::error::connection_reset;
      return Fail(cut ? HttpFailure::kTruncated : HttpFailure::kNetwork,
                  Error("{}: body of bytes {}-{} ended after {} of {} bytes: {}", where, first,
                        last, reply->received, expect, Describe(ec)));
    }
  }
  if (reply->received != expect) {
    return Fail(HttpFailure::kTruncated,
                Error("{}: body of bytes {}-{} ended after {} of {} bytes", where, first, last,
                      reply->received, expect));
  }
  if (!parser.keep_alive()) im.Close();
  return Status::Ok();
}

}  // namespace kvasir::net
