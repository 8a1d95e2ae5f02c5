// `kvasir serve`'s HTTP API in front of a ring (docs/API.md): OpenAI's POST /v1/completions,
// POST /v1/chat/completions (whole or streamed as Server-Sent Events) and GET /v1/models;
// llama-server's GET /health, GET /metrics, POST /tokenize and POST /detokenize. It runs on
// net::HttpServer (the skeleton the relay and the market share), checks each request (bearer key
// in constant time, body limit, fields), and hands those for the ring to a SessionQueue, whose
// workers run them through RingAccess. Every refusal is an OpenAI error body with its status.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "net/http_server.h"
#include "serve/answer.h"
#include "serve/metrics.h"
#include "serve/ring_access.h"
#include "serve/session_queue.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvasir::serve {

struct ServeOptions {
  std::string listen = "127.0.0.1:8080";
  int listen_fd = -1;                     // a socket already listening, instead of binding `listen`
  std::string model_name = "kvasir";      // what /v1/models lists and requests must name (or omit)
  std::optional<ChatFamily> chat_family;  // for /v1/chat/completions
  // For /tokenize and /detokenize, and to check logit_bias ids; null: those answer 501.
  std::shared_ptr<const Tokenizer> tokenizer;
  std::string api_key;      // "": no key asked
  std::string cors_origin;  // "": no CORS headers
  int max_sessions = 16;    // requests on the ring at once
  int max_waiting = 64;     // requests waiting for a place (then 429)
  size_t max_body_bytes = size_t{1} << 20;
  size_t stream_buffer_bytes = size_t{1} << 20;
  int request_timeout_ms = 30000;  // to read a request, and to write each piece of an answer
  int idle_timeout_ms = 60000;     // a kept-alive connection between requests
  int max_connections = 512;
  int max_connections_per_address = 128;
};

class ApiServer {
 public:
  // Binds and starts serving; `ring` must outlive the server.
  static Result<std::unique_ptr<ApiServer>> Start(const ServeOptions& options, RingAccess* ring);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  uint16_t port() const { return http_->port(); }
  // Stops accepting, drops waiting requests (503), lets running ones end, closes connections.
  void Stop();
  MetricsGauges Gauges() const;

 private:
  ApiServer(ServeOptions options, RingAccess* ring);
  void Handle(net::HttpServerRequest request, net::HttpResponder reply);
  void Complete(const net::HttpServerRequest& request, Endpoint endpoint,
                const net::HttpResponder& reply);
  net::HttpServerResponse Health() const;
  net::HttpServerResponse Tokenize(const net::HttpServerRequest& request) const;
  net::HttpServerResponse Detokenize(const net::HttpServerRequest& request) const;
  bool Authorized(const net::HttpServerRequest& request) const;

  const ServeOptions o_;
  RingAccess* ring_;
  Metrics metrics_;
  SessionQueue queue_;
  // Work that needs no ring but may take a while (tokenizing a large text): off the server's
  // thread, one at a time, a few waiting.
  SessionQueue local_queue_;
  std::string key_digest_;  // SHA-256 of the API key
  int64_t created_ = 0;     // when the server started (Unix seconds): the model's "created"
  std::unique_ptr<net::HttpServer> http_;
};

}  // namespace kvasir::serve
