// HTTP/1.1 (over TLS when given a certificate) on the server skeleton of net/server.h: the market
// and the OpenAI-compatible API put a request handler behind it. Bounded per peer: the request
// header (`max_header_bytes`, 431) and body (`max_body_bytes`, refused with 413 on its
// Content-Length before it is read, a chunked one at the limit), and a deadline for each stage of a
// connection (silent, reading, writing, idle between requests, closing), shorter under pressure.
// A response can mark its connection proven (the request carried a verified signature): kept
// alive, it then holds a place in the proven pool, which no flood of strangers can take.
// A response can also be streamed (Server-Sent Events): its body is an HttpBodyStream that a
// producer writes while the server sends each piece as a chunk; see HttpServerResponse::stream.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "net/http_stream.h"
#include "net/server.h"

namespace kvasir::net {

struct HttpServerRequest {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // "/v1/claims/17?x=y"
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;
  std::string remote_ip;
};

struct HttpServerResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // more fields ("Allow", ...)
  // The request proved who sent it: the connection moves to the proven pool.
  bool proven = false;
  // When set, `body` is ignored: the head goes out at once with `Transfer-Encoding: chunked` and
  // `Connection: close`, then each batch of bytes written to the stream as one chunk, until the
  // stream ends. While the answer streams, the server watches the connection: a client that closes
  // it, a write that runs past the writing deadline, or a producer that gets more than the
  // stream's limit ahead of the client marks the stream gone (its producer finds out) and closes
  // the connection. Between chunks the connection waits for its producer without a deadline.
  std::shared_ptr<HttpBodyStream> stream;
};

// Answers one request. Called on the server's thread; `reply` may be called then or later, from any
// thread, exactly once (a handler that works for long hands the request to its own threads and
// replies from there: the server meanwhile serves the others). A reply for a connection that has
// gone is dropped.
using HttpResponder = std::function<void(HttpServerResponse)>;
using HttpHandler = std::function<void(HttpServerRequest request, HttpResponder reply)>;

// A handler that answers at once, on the server's thread.
HttpHandler Synchronous(std::function<HttpServerResponse(const HttpServerRequest&)> answer);

// The server's own refusals (413, 431, 503 when full), so a JSON API answers in its own format.
using HttpErrorBody = std::function<HttpServerResponse(int status, const std::string& code,
                                                       const std::string& message)>;

struct HttpServerOptions {
  ServerOptions server;  // listen, TLS, admission limits and stage deadlines
  std::string server_header = "kvasir";
  size_t max_header_bytes = 8 * 1024;
  size_t max_body_bytes = size_t{1} << 20;
  HttpErrorBody error_body;  // null: plain text
};

// Stage deadlines for an HTTP server: a request must be complete `request_timeout_ms` after a
// connection's first byte (or its previous answer), and an answer written within as long; a
// kept-alive connection may idle `idle_timeout_ms`. Under pressure a silent or idle connection
// gets 1 s, a request or an answer under way 4 s.
void SetHttpTimeouts(AdmissionPolicy* policy, int request_timeout_ms, int idle_timeout_ms);

struct HttpServerStats {
  ServerStats server;
  uint64_t requests = 0;  // answered
  uint64_t rejected = 0;  // refused for a limit (413, 431) or dropped as malformed
  uint64_t streams_dropped = 0;  // streamed answers whose client went before their end
};

class HttpServer {
 public:
  static Result<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                   HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const { return server_->port(); }
  bool tls() const { return server_->tls(); }
  HttpServerStats stats() const;
  // As Server::WaitFor.
  bool WaitFor(const std::function<bool()>& done, int timeout_ms) const {
    return server_->WaitFor(done, timeout_ms);
  }
  // Closes every connection and joins the thread. Idempotent.
  void Stop();

  struct Shared;

 private:
  HttpServer() = default;
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<Server> server_;
};

}  // namespace kvasir::net
