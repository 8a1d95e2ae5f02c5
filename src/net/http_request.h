// HTTP(S) requests with their whole answer, for small JSON APIs (the market): connect with the
// shared secure dial (net/dial.h), send, read the response with a size limit. Blocking on the
// caller's thread, with one deadline over each request. HttpSession keeps its connection open
// across requests (HTTP/1.1 keep-alive, TLS included); HttpRequest() is one request on a
// connection of its own.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "base/status.h"
#include "net/url.h"

namespace kvasir::net {

struct HttpRequestOptions {
  std::string ca_file;     // PEM certificates to trust for https:// instead of the system's
  int timeout_ms = 10000;  // connect, send and the whole response
  size_t max_body_bytes = size_t{16} << 20;
  std::function<bool()> cancelled;  // polled while waiting; true abandons the request
};

struct HttpReply {
  int status = 0;
  std::string content_type;
  std::string body;
};

// One connection to one origin (scheme, host, port) for a sequence of requests, used by one
// thread at a time. It connects on the first request, stays open while the server keeps it alive,
// and connects again for the next request once it is closed (by the server's `Connection: close`,
// an error, a timeout, or the server closing it while idle).
class HttpSession {
 public:
  // `origin`: an http:// or https:// URL (its target is ignored). Sets up TLS (an unreadable
  // ca_file is an error here); connects lazily.
  static Result<std::unique_ptr<HttpSession>> Create(const Url& origin,
                                                     const HttpRequestOptions& options,
                                                     bool keep_alive = true);
  ~HttpSession();
  HttpSession(const HttpSession&) = delete;
  HttpSession& operator=(const HttpSession&) = delete;

  // `method` `target` ("/v1/map") with `headers` and `body` (Content-Type application/json when a
  // body is given), within options.timeout_ms. Any status is a reply; errors are the network's
  // (kUnavailable, kTimeout), a certificate that does not verify (kUnauthenticated), or a response
  // over max_body_bytes (kTooLarge), each naming the URL. On an error the connection is closed.
  // `*unanswered` (when not null) is set when the request went out on a connection kept from an
  // earlier one and the server closed it before a byte of the answer: a server closes idle
  // connections, so the request was most likely never read and may be sent again (on a new
  // connection: call Send again; with a new signature where replays are refused).
  Result<HttpReply> Send(const std::string& method, const std::string& target,
                         const std::map<std::string, std::string>& headers, const std::string& body,
                         bool* unanswered = nullptr);

  bool connected() const;
  // Requests answered on the current connection (0: none yet, or not connected).
  int answered_on_connection() const;
  // Connections opened so far.
  int connects() const;
  void Close();

 private:
  struct Impl;
  explicit HttpSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// `method` to `url` on a connection of its own, closed after the answer (Connection: close);
// as HttpSession::Send otherwise.
Result<HttpReply> HttpRequest(const std::string& method, const std::string& url,
                              const std::map<std::string, std::string>& headers,
                              const std::string& body, const HttpRequestOptions& options = {});

}  // namespace kvasir::net
