// A blocking HTTP/1.1 client for byte-range downloads (Boost.Beast over Asio; TLS through
// OpenSSL). One HttpClient is one keep-alive connection, used by one thread. It does exactly what
// `kvasir fetch` needs and checks everything the server says: a range request must come back as
// 206 with a Content-Range naming exactly the bytes asked for and a body of exactly that length,
// or the call fails with a message saying what the server did instead.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "base/status.h"
#include "net/url.h"

namespace kvasir::net {

struct HttpOptions {
  std::string ca_file;             // PEM certificates to trust instead of the system's store
  int connect_timeout_ms = 15000;  // name lookup, TCP connect and TLS handshake, each
  int io_timeout_ms = 30000;       // any single read or write: a stalled server fails, never hangs
  int max_redirects = 5;
};

// What went wrong, so a caller can decide whether trying again can help.
enum class HttpFailure {
  kNone,
  kNetwork,    // lookup, connect, reset, timeout: retry
  kTruncated,  // the body ended before the promised length: retry from where it stopped
  kServerBusy, // 408, 429, 5xx: retry later
  kRefused,    // the server cannot serve this (ignores Range, 404, bad TLS certificate): give up
};

struct RangeReply {
  uint64_t first = 0, last = 0;  // the bytes the server sent, inclusive (Content-Range)
  uint64_t total_size = 0;       // the whole file's size from Content-Range, 0 when '*'
  std::string etag;              // validators, to notice a file replaced mid-download
  std::string last_modified;
  uint64_t received = 0;         // body bytes handed to the sink (also on failure)
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

  // GET bytes [offset, offset + length) of url(), streaming the body into `sink`. Follows up to
  // max_redirects redirects (url() then names the final location). With `clamp_at_eof` a reply
  // that stops at the end of a shorter file is accepted (for reading a header of unknown size).
  // On failure, failure() says which kind; `reply` is filled as far as the reply got.
  Status GetRange(uint64_t offset, uint64_t length, bool clamp_at_eof, const BodySink& sink,
                  RangeReply* reply);

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
  Status RequestOnce(uint64_t offset, uint64_t length, bool clamp_at_eof, const BodySink& sink,
                     RangeReply* reply, std::string* redirect);

  Url url_;
  HttpOptions options_;
  std::unique_ptr<Impl> impl_;
  HttpFailure failure_ = HttpFailure::kNone;
  uint64_t requests_ = 0;
  bool stale_retry_used_ = false;
};

// Parses "bytes FIRST-LAST/TOTAL" (TOTAL may be '*', then *total = 0). False when malformed.
bool ParseContentRange(std::string_view value, uint64_t* first, uint64_t* last, uint64_t* total);

}  // namespace kvasir::net
