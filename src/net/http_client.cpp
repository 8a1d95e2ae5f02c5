#include "net/http_client.h"

// <utility> first: Boost 1.74's Asio needs it before its headers under GCC 12 in C++20 mode.
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
#include <utility>
#include <vector>

#include "base/check.h"
#include "net/dial.h"

namespace kvasir::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kBodyBuffer = size_t{256} << 10;
constexpr size_t kHeaderLimit = 64 * 1024;
constexpr const char* kUserAgent = "kvasir-fetch/0.1";

bool ParseU64(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

bool IsTimeout(const error_code& ec) {
  return ec == beast::error::timeout || ec == asio::error::timed_out;
}

// The fields of a parsed Beast header that JudgeReply looks at.
template <class Fields>
ResponseHead HeadOf(const http::response_header<Fields>& h, boost::optional<uint64_t> length) {
  ResponseHead head;
  head.status = h.result_int();
  head.reason = std::string(h.reason());
  head.content_range = std::string(h[http::field::content_range]);
  head.etag = std::string(h[http::field::etag]);
  head.last_modified = std::string(h[http::field::last_modified]);
  head.location = std::string(h[http::field::location]);
  if (length) head.content_length = *length;
  return head;
}

// "ETag "x"" or "Last-Modified <date>": what an If-Range value pinned.
std::string DescribePin(std::string_view if_range) {
  return fmt::format("{} {}", IsStrongEtag(if_range) ? "ETag" : "Last-Modified", if_range);
}

// What the reply says now about the validator the request was pinned to.
std::string DescribeNow(const ResponseHead& head, std::string_view if_range) {
  if (IsStrongEtag(if_range)) return head.etag.empty() ? "no ETag" : "ETag " + head.etag;
  return head.last_modified.empty() ? "no Last-Modified" : "Last-Modified " + head.last_modified;
}

bool SameVersion(const ResponseHead& head, std::string_view if_range) {
  return IsStrongEtag(if_range) ? head.etag == if_range : head.last_modified == if_range;
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

bool IsStrongEtag(std::string_view etag) {
  if (etag.size() < 2 || etag.front() != '"' || etag.back() != '"') return false;
  for (char c : etag.substr(1, etag.size() - 2)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x21 || u == '"' || u == 0x7f) return false;
  }
  return true;
}

std::optional<int64_t> ParseHttpDate(std::string_view s) {
  // "Sun, 06 Nov 1994 08:49:37 GMT"
  static constexpr std::string_view kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr std::string_view kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                 "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  static constexpr int kMonthDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (s.size() != 29 || s.substr(3, 2) != ", " || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' ||
      s[19] != ':' || s[22] != ':' || s.substr(25) != " GMT") {
    return std::nullopt;
  }
  auto number = [&](size_t at, size_t n, int* out) {
    *out = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return false;
      *out = *out * 10 + (s[i] - '0');
    }
    return true;
  };
  int day = 0, year = 0, hour = 0, minute = 0, second = 0;
  if (!number(5, 2, &day) || !number(12, 4, &year) || !number(17, 2, &hour) ||
      !number(20, 2, &minute) || !number(23, 2, &second)) {
    return std::nullopt;
  }
  int month = 0;
  while (month < 12 && kMonths[month] != s.substr(8, 3)) ++month;
  int weekday = 0;
  while (weekday < 7 && kDays[weekday] != s.substr(0, 3)) ++weekday;
  if (month == 12 || weekday == 7 || hour > 23 || minute > 59 || second > 60) return std::nullopt;
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  if (day < 1 || day > kMonthDays[month] + (month == 1 && leap ? 1 : 0)) return std::nullopt;
  // Days since 1970-01-01: whole years (with their leap days), then whole months of this year.
  auto leaps_through = [](int64_t y) { return y / 4 - y / 100 + y / 400; };
  int64_t days = 365 * (int64_t{year} - 1970) + leaps_through(year - 1) - leaps_through(1969);
  for (int m = 0; m < month; ++m) days += kMonthDays[m] + (m == 1 && leap ? 1 : 0);
  days += day - 1;
  // 1970-01-01 was a Thursday; a date whose weekday is wrong is not a date.
  if (((days % 7) + 7 + 4) % 7 != weekday) return std::nullopt;
  return days * 86400 + hour * 3600 + minute * 60 + second;
}

std::string IfRangeValidator(std::string_view etag, std::string_view last_modified) {
  if (IsStrongEtag(etag)) return std::string(etag);
  if (ParseHttpDate(last_modified)) return std::string(last_modified);
  return "";
}

Result<ResponseHead> ParseResponseHead(std::string_view bytes) {
  http::response_parser<http::empty_body> parser;
  parser.header_limit(kHeaderLimit);
  parser.eager(false);
  error_code ec;
  size_t used = 0;
  while (!parser.is_header_done() && used < bytes.size()) {
    const size_t n = parser.put(asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (ec) break;
    if (n == 0) break;
    used += n;
  }
  if (ec && ec != http::error::need_more) {
    return Error("not an HTTP response head: {}", ec.message());
  }
  if (!parser.is_header_done()) return Error("incomplete HTTP response head");
  return HeadOf(parser.get().base(), parser.content_length());
}

ReplyVerdict JudgeReply(const ResponseHead& head, const RangeRequest& rq, std::string_view where) {
  ReplyVerdict v;
  auto fail = [&](HttpFailure kind, Status status) {
    v.failure = kind;
    v.status = std::move(status);
    return v;
  };
  if (rq.length == 0 || rq.length - 1 > std::numeric_limits<uint64_t>::max() - rq.offset) {
    return fail(HttpFailure::kRefused,
                Error("{}: cannot ask for {} bytes at offset {}", where, rq.length, rq.offset));
  }
  const uint64_t want_last = rq.offset + rq.length - 1;
  const unsigned status = head.status;
  if (status == 301 || status == 302 || status == 303 || status == 307 || status == 308) {
    if (head.location.empty()) {
      return fail(HttpFailure::kRefused,
                  Error("{}: redirect {} without a Location header", where, status));
    }
    v.redirect = head.location;
    return v;
  }
  if (status == 200) {
    if (!rq.if_range.empty() && !SameVersion(head, rq.if_range)) {
      // If-Range did not match: the server sends the whole of a file that is no longer the one
      // the download started from.
      return fail(HttpFailure::kChanged,
                  Error("the file at {} changed during the download (it was {}, the server now "
                        "has {} and sent the whole file instead of bytes {}-{})",
                        where, DescribePin(rq.if_range), DescribeNow(head, rq.if_range), rq.offset,
                        want_last));
    }
    return fail(HttpFailure::kRefused,
                Error("{}: the server ignored the Range request (it answered 200 with the whole "
                      "file instead of 206 with bytes {}-{}); kvasir fetch needs a server that "
                      "honours HTTP Range requests",
                      where, rq.offset, want_last));
  }
  if (status == 416) {
    return fail(HttpFailure::kRefused,
                Error("{}: bytes {}-{} are past the end of the file (416 Range Not Satisfiable, "
                      "Content-Range: {}); the file on the server is shorter than expected",
                      where, rq.offset, want_last, head.content_range));
  }
  if (status == 408 || status == 429 || status >= 500) {
    return fail(
        HttpFailure::kServerBusy,
        Error(StatusCode::kUnavailable, "{}: server answered {} {}", where, status, head.reason));
  }
  if (status != 206) {
    return fail(HttpFailure::kRefused,
                Error("{}: server answered {} {}", where, status, head.reason));
  }
  if (!rq.if_range.empty() && !SameVersion(head, rq.if_range)) {
    // A server that does not implement If-Range sends the range of whatever file it has now.
    return fail(HttpFailure::kChanged,
                Error("the file at {} changed during the download (it was {}, the server now "
                      "has {})",
                      where, DescribePin(rq.if_range), DescribeNow(head, rq.if_range)));
  }
  uint64_t first = 0, last = 0, total = 0;
  if (!ParseContentRange(head.content_range, &first, &last, &total)) {
    return fail(HttpFailure::kRefused,
                Error("{}: 206 reply with a missing or malformed Content-Range '{}' (asked for "
                      "bytes {}-{}; multi-range replies are not supported)",
                      where, head.content_range, rq.offset, want_last));
  }
  const bool clamped = rq.clamp_at_eof && total != 0 && last == total - 1 && last < want_last;
  if (first != rq.offset || (last != want_last && !clamped)) {
    return fail(HttpFailure::kRefused, Error("{}: asked for bytes {}-{}, the server sent '{}'",
                                             where, rq.offset, want_last, head.content_range));
  }
  if (head.content_length && *head.content_length != last - first + 1) {
    return fail(HttpFailure::kRefused,
                Error("{}: Content-Length {} does not match Content-Range '{}'", where,
                      *head.content_length, head.content_range));
  }
  v.first = first;
  v.last = last;
  v.total = total;
  return v;
}

struct HttpClient::Impl {
  asio::io_context ioc;
  std::unique_ptr<ssl::context> tls_ctx;
  std::unique_ptr<beast::tcp_stream> plain;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;
  std::string connected_to;  // Authority() of the open connection, empty when closed

  beast::tcp_stream& lowest() { return tls ? beast::get_lowest_layer(*tls) : *plain; }

  // Runs one asynchronous operation of a request to completion on this thread, or until `until`:
  // then it is cancelled and the result is a timeout. The socket operations carry the request's
  // deadline themselves (tcp_stream::expires_at); `until` is a backstop behind it.
  template <class Start>
  error_code Run(Start&& start, Clock::time_point until, const std::function<void()>& cancel) {
    return RunIo(ioc, std::forward<Start>(start), IoLimits{until, {}}, cancel);
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
  KV_ASSIGN_OR_RETURN(impl->tls_ctx, MakeTlsClientContext(options.ca_file));
  return std::unique_ptr<HttpClient>(new HttpClient(url, options, std::move(impl)));
}

void HttpClient::Close() { impl_->Close(); }

Status HttpClient::Fail(HttpFailure kind, Status status) {
  failure_ = kind;
  impl_->Close();
  const bool transient = kind == HttpFailure::kNetwork || kind == HttpFailure::kTruncated ||
                         kind == HttpFailure::kServerBusy;
  if (transient && status.code() != StatusCode::kTimeout) {
    return status.WithCode(StatusCode::kUnavailable);
  }
  return status;
}

Status HttpClient::GetRange(const RangeRequest& rq, const BodySink& sink, RangeReply* reply) {
  KV_CHECK(rq.length > 0);
  failure_ = HttpFailure::kNone;
  if (!rq.if_range.empty() && !IsStrongEtag(rq.if_range) && !ParseHttpDate(rq.if_range)) {
    return Fail(HttpFailure::kRefused,
                Error("{}: '{}' is neither a strong ETag nor an HTTP date, so it cannot pin the "
                      "file with If-Range",
                      url_.ToString(), rq.if_range));
  }
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(options_.request_timeout_ms);
  for (int hop = 0;; ++hop) {
    std::string redirect;
    *reply = RangeReply{};
    const bool reused = !impl_->connected_to.empty();
    Status s = RequestOnce(rq, deadline, sink, reply, &redirect);
    // A kept-alive connection the server has since closed fails before any reply byte: that is
    // not a failure of the server, so try once more on a fresh connection.
    if (!s.ok() && reused && failure_ == HttpFailure::kNetwork && reply->received == 0 &&
        s.code() != StatusCode::kTimeout) {
      *reply = RangeReply{};
      s = RequestOnce(rq, deadline, sink, reply, &redirect);
    }
    if (!s.ok() || redirect.empty()) return s;
    if (hop >= options_.max_redirects) {
      return Fail(HttpFailure::kRefused,
                  Error("{}: more than {} redirects", url_.ToString(), options_.max_redirects));
    }
    auto next = ResolveLocation(url_, redirect);
    if (!next.ok()) return Fail(HttpFailure::kRefused, next.status());
    if (url_.tls() && !next->tls()) {
      return Fail(HttpFailure::kRefused, Error("{}: refusing a redirect from https to {}",
                                               url_.ToString(), next->ToString()));
    }
    url_ = *next;
  }
}

Status HttpClient::RequestOnce(const RangeRequest& rq, Clock::time_point deadline,
                               const BodySink& sink, RangeReply* reply, std::string* redirect) {
  Impl& im = *impl_;
  const std::string where = url_.ToString();
  // Socket deadlines fire first; this margin only bounds the event loop around them.
  const Clock::time_point backstop = deadline + std::chrono::seconds(1);
  // A timeout's message says how long the whole request had.
  auto timed_out = [&](const std::string& message) {
    return Status::Error(fmt::format("{} (the whole request must finish within {:.1f} s)", message,
                                     options_.request_timeout_ms / 1000.0),
                         StatusCode::kTimeout);
  };
  // A network failure: a timeout (the request's deadline passed) or another error.
  auto net_fail = [&](HttpFailure kind, const error_code& ec, std::string message,
                      StatusCode code = StatusCode::kUnavailable) {
    if (IsTimeout(ec)) return Fail(kind, timed_out(message));
    return Fail(kind, Status::Error(std::move(message), code));
  };
  if (Clock::now() >= deadline) {
    return net_fail(HttpFailure::kNetwork, beast::error::timeout,
                    fmt::format("{}: the request timed out before it was sent", where));
  }

  if (im.connected_to != url_.Authority() || (!im.plain && !im.tls)) {
    im.Close();
    const IoLimits connect_limits{
        std::min(deadline, Clock::now() + std::chrono::milliseconds(options_.connect_timeout_ms)),
        {}};
    if (url_.tls()) {
      im.tls = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(im.ioc, *im.tls_ctx);
    } else {
      im.plain = std::make_unique<beast::tcp_stream>(im.ioc);
    }
    Status dialed = ConnectTcp(im.ioc, im.lowest(), url_, connect_limits);
    if (dialed.ok() && im.tls) {
      dialed = HandshakeTls(im.ioc, *im.tls, url_, connect_limits);
      if (dialed.code() == StatusCode::kUnauthenticated) {
        dialed = Status::Error(
            dialed.message() + " (use --ca FILE to trust a private certificate authority)",
            dialed.code());
      }
    }
    // Lookup, connect and TLS failures are worth another try, except a certificate that does not
    // verify or a server name that TLS cannot carry.
    if (dialed.code() == StatusCode::kTimeout) {
      return Fail(HttpFailure::kNetwork, timed_out(dialed.message()));
    }
    if (dialed.code() == StatusCode::kUnavailable) return Fail(HttpFailure::kNetwork, dialed);
    if (!dialed.ok()) return Fail(HttpFailure::kRefused, dialed);
    im.connected_to = url_.Authority();
  }

  const uint64_t want_last = rq.offset + rq.length - 1;
  http::request<http::empty_body> req{http::verb::get, url_.target, 11};
  req.set(http::field::host, url_.port == (url_.tls() ? 443 : 80) ? url_.host : url_.Authority());
  req.set(http::field::user_agent, kUserAgent);
  req.set(http::field::accept_encoding, "identity");
  req.set(http::field::range,
          "bytes=" + std::to_string(rq.offset) + "-" + std::to_string(want_last));
  if (!rq.if_range.empty()) req.set(http::field::if_range, rq.if_range);
  ++requests_;
  im.lowest().expires_at(deadline);
  error_code ec = im.Run(
      [&](auto handler) {
        if (im.tls) {
          http::async_write(*im.tls, req, std::move(handler));
        } else {
          http::async_write(*im.plain, req, std::move(handler));
        }
      },
      backstop, [&] { im.lowest().cancel(); });
  if (ec) {
    return net_fail(HttpFailure::kNetwork, ec,
                    fmt::format("{}: sending the request failed: {}", where, DescribeIoError(ec)));
  }

  // Beast reads at most the buffer's free capacity per call: a large one keeps system calls few.
  im.buffer.reserve(kBodyBuffer);
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  parser.header_limit(kHeaderLimit);
  im.lowest().expires_at(deadline);
  ec = im.Run(
      [&](auto handler) {
        if (im.tls) {
          http::async_read_header(*im.tls, im.buffer, parser, std::move(handler));
        } else {
          http::async_read_header(*im.plain, im.buffer, parser, std::move(handler));
        }
      },
      backstop, [&] { im.lowest().cancel(); });
  if (ec) {
    // A reply that is not valid HTTP will not become valid on a second try. A connection closed
    // before or inside the header (end_of_stream, partial_message: Beast's HTTP category too) is
    // the network's doing, as when a server restarts: that one is retried.
    const bool closed = ec == http::error::end_of_stream || ec == http::error::partial_message;
    const bool garbage =
        !closed && ec.category() == http::make_error_code(http::error::bad_version).category();
    return net_fail(
        garbage ? HttpFailure::kRefused : HttpFailure::kNetwork, ec,
        fmt::format("{}: reading the response header failed: {}", where, DescribeIoError(ec)),
        garbage ? StatusCode::kInvalidInput : StatusCode::kUnavailable);
  }
  const ResponseHead head = HeadOf(parser.get().base(), parser.content_length());
  reply->etag = head.etag;
  reply->last_modified = head.last_modified;
  ReplyVerdict verdict = JudgeReply(head, rq, where);
  if (verdict.failure != HttpFailure::kNone) return Fail(verdict.failure, verdict.status);
  if (!verdict.redirect.empty()) {
    *redirect = verdict.redirect;
    im.Close();
    return Status::Ok();
  }
  const uint64_t first = verdict.first, last = verdict.last;
  reply->first = first;
  reply->last = last;
  reply->total_size = verdict.total;
  const uint64_t expect = last - first + 1;

  std::vector<uint8_t> buf(kBodyBuffer);
  while (!parser.is_done()) {
    parser.get().body().data = buf.data();
    parser.get().body().size = buf.size();
    im.lowest().expires_at(deadline);
    ec = im.Run(
        [&](auto handler) {
          if (im.tls) {
            http::async_read_some(*im.tls, im.buffer, parser, std::move(handler));
          } else {
            http::async_read_some(*im.plain, im.buffer, parser, std::move(handler));
          }
        },
        backstop, [&] { im.lowest().cancel(); });
    if (ec == http::error::need_buffer) ec = {};
    const size_t n = buf.size() - parser.get().body().size;
    if (n > 0) {
      if (reply->received + n > expect) {
        return Fail(HttpFailure::kRefused,
                    Error("{}: body longer than Content-Range '{}'", where, head.content_range));
      }
      if (Status s = sink(std::span<const uint8_t>(buf.data(), n)); !s.ok()) {
        return Fail(HttpFailure::kRefused, s);
      }
      reply->received += n;
    }
    if (ec) {
      const bool cut = ec == http::error::partial_message || ec == http::error::end_of_stream ||
                       ec == asio::error::eof || ec == asio::error::connection_reset;
      return net_fail(cut ? HttpFailure::kTruncated : HttpFailure::kNetwork, ec,
                      fmt::format("{}: body of bytes {}-{} ended after {} of {} bytes: {}", where,
                                  first, last, reply->received, expect, DescribeIoError(ec)));
    }
  }
  if (reply->received != expect) {
    return Fail(HttpFailure::kTruncated, Error("{}: body of bytes {}-{} ended after {} of {} bytes",
                                               where, first, last, reply->received, expect));
  }
  if (!parser.keep_alive()) im.Close();
  return Status::Ok();
}

}  // namespace kvasir::net
