// A blocking HTTP/1.1 client for byte-range downloads (Boost.Beast over Asio; TLS through
// OpenSSL). One HttpClient is one keep-alive connection, used by one thread. It does exactly what
// `kvasir fetch` needs and checks everything the server says: a range request must come back as
// 206 with a Content-Range naming exactly the bytes asked for and a body of exactly that length,
// or the call fails with a message saying what the server did instead. A request can be pinned to
// one version of the file (If-Range): a server that answers with the whole file instead means the
// file changed, and the call fails with HttpFailure::kChanged.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"
#include "net/url.h"

namespace kvasir::net {

struct HttpOptions {
  std::string ca_file;  // PEM certificates to trust instead of the system's store
  // The connection part (name lookup, TCP connect, TLS handshake) of a request, at most.
  int connect_timeout_ms = 15000;
  // The whole of one GetRange() call: connect, send and the entire response (redirects included),
  // however the bytes trickle in. A server that stalls or dribbles fails with kTimeout.
  int request_timeout_ms = 30000;
  int max_redirects = 5;
};

// What went wrong, so a caller can decide whether trying again can help.
enum class HttpFailure {
  kNone,
  kNetwork,     // lookup, connect, reset, timeout: retry
  kTruncated,   // the body ended before the promised length: retry from where it stopped
  kServerBusy,  // 408, 429, 5xx: retry later
  kRefused,     // the server cannot serve this (ignores Range, 404, bad TLS certificate): give up
  kChanged,     // the file is not the version the request was pinned to (If-Range): give up
};

// One range request: bytes [offset, offset + length) of the URL.
struct RangeRequest {
  uint64_t offset = 0;
  uint64_t length = 0;
  // Accept a reply that stops at the end of a shorter file (for reading a header of unknown size).
  bool clamp_at_eof = false;
  // Sent as If-Range when not empty: a strong ETag or an HTTP date (see IfRangeValidator). The
  // server then sends the range only if the file is still that version, else the whole file.
  std::string if_range;
};

struct RangeReply {
  uint64_t first = 0, last = 0;  // the bytes the server sent, inclusive (Content-Range)
  uint64_t total_size = 0;       // the whole file's size from Content-Range, 0 when '*'
  std::string etag;              // validators, to notice a file replaced mid-download
  std::string last_modified;
  uint64_t received = 0;  // body bytes handed to the sink (also on failure)
};

// Receives body bytes in order; an error stops the transfer and is returned by GetRange().
using BodySink = std::function<Status(std::span<const uint8_t>)>;

class HttpClient {
 public:
  // Sets up TLS for https:// URLs (an unreadable --ca file is an error here). Connects lazily.
  static Result<std::unique_ptr<HttpClient>> Create(const Url& url, const HttpOptions& options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // GET the bytes of `request` from url(), streaming the body into `sink`, within
  // request_timeout_ms. Follows up to max_redirects redirects (url() then names the final
  // location). A request on a kept-alive connection that turns out to be closed before any reply
  // byte is sent once more on a new connection. On failure, failure() says which kind and the
  // Status code is kTimeout (deadline), kUnavailable (network, truncated, busy) or kInvalidInput;
  // `reply` is filled as far as the reply got.
  Status GetRange(const RangeRequest& request, const BodySink& sink, RangeReply* reply);
  Status GetRange(uint64_t offset, uint64_t length, bool clamp_at_eof, const BodySink& sink,
                  RangeReply* reply) {
    return GetRange(RangeRequest{offset, length, clamp_at_eof, {}}, sink, reply);
  }

  HttpFailure failure() const { return failure_; }
  bool retryable() const {
    return failure_ == HttpFailure::kNetwork || failure_ == HttpFailure::kTruncated ||
           failure_ == HttpFailure::kServerBusy;
  }
  const Url& url() const { return url_; }
  uint64_t requests() const { return requests_; }
  // Drops the connection (the next request reconnects).
  void Close();

 private:
  struct Impl;
  HttpClient(Url url, HttpOptions options, std::unique_ptr<Impl> impl);
  Status Fail(HttpFailure kind, Status status);
  Status RequestOnce(const RangeRequest& request, std::chrono::steady_clock::time_point deadline,
                     const BodySink& sink, RangeReply* reply, std::string* redirect);

  Url url_;
  HttpOptions options_;
  std::unique_ptr<Impl> impl_;
  HttpFailure failure_ = HttpFailure::kNone;
  uint64_t requests_ = 0;
};

// The parts of a response head that a range download looks at.
struct ResponseHead {
  unsigned status = 0;
  std::string reason;
  std::string content_range, etag, last_modified, location;
  std::optional<uint64_t> content_length;
};

// Parses a response head (status line and headers up to the empty line) with the parser the
// client uses. An error (kInvalidInput) when it is not valid HTTP/1.x or not complete.
Result<ResponseHead> ParseResponseHead(std::string_view bytes);

// What a response head means for `request`.
struct ReplyVerdict {
  HttpFailure failure = HttpFailure::kNone;  // kNone: follow `redirect`, or read the body
  Status status;                             // why, when failure is not kNone
  std::string redirect;                      // a Location to follow
  uint64_t first = 0, last = 0, total = 0;   // the body's bytes (Content-Range), inclusive
};
// Judges a reply head to `request` sent to `where` (named in messages): a redirect, the range
// asked for (then first == request.offset, last - first < request.length, and Content-Length, when
// given, is last - first + 1), or the failure with its message. Never trusts the head.
ReplyVerdict JudgeReply(const ResponseHead& head, const RangeRequest& request,
                        std::string_view where);

// Parses "bytes FIRST-LAST/TOTAL" (TOTAL may be '*', then *total = 0). False when malformed.
bool ParseContentRange(std::string_view value, uint64_t* first, uint64_t* last, uint64_t* total);

// True for a strong entity tag: "..." of visible characters, no W/ prefix.
bool IsStrongEtag(std::string_view etag);
// Parses an HTTP date in the preferred form ("Sun, 06 Nov 1994 08:49:37 GMT") into seconds since
// 1970; nullopt for anything else (the obsolete forms included).
std::optional<int64_t> ParseHttpDate(std::string_view text);
// The If-Range value that pins a file whose reply carried these validators: the ETag when it is
// strong (a weak ETag cannot be used with If-Range), else Last-Modified when it is a valid HTTP
// date, else "" (the file cannot be pinned).
std::string IfRangeValidator(std::string_view etag, std::string_view last_modified);

}  // namespace kvasir::net
