#include "serve/api_server.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "base/log.h"
#include "base/sha256.h"
#include "base/timing_trace.h"
#include "ring/messages.h"
#include "serve/openai_json.h"
#include "serve/request.h"
#include "serve/ring_request.h"
#include "serve/tool_grammar.h"
#include "serve/tool_output.h"

namespace kvasir::serve {
namespace {

using json = nlohmann::ordered_json;

Sha256Digest Digest(const std::string& s) {
  return Sha256Of(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

net::HttpServerResponse Json(int status, const json& j) {
  net::HttpServerResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

ApiError Unavailable(const std::string& message) {
  ApiError e;
  e.status = 503;
  e.type = "server_error";
  e.code = "ring_unavailable";
  e.message = message;
  e.retry_after_s = 1;
  return e;
}

// Routes and the methods they take. A path that is none of them is counted as "other", so the
// metrics' labels stay few whatever paths clients ask for.
struct Route {
  const char* path;
  const char* method;
};
constexpr Route kRoutes[] = {
    {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
    {"/v1/models", "GET"},       {"/health", "GET"},
    {"/metrics", "GET"},         {"/tokenize", "POST"},
    {"/detokenize", "POST"},
};

const Route* FindRoute(const std::string& path) {
  for (const Route& r : kRoutes) {
    if (path == r.path) return &r;
  }
  return nullptr;
}

// Whether `piece` is valid UTF-8 (Utf8Stream changes nothing in valid text).
bool ValidUtf8(const std::string& piece) {
  Utf8Stream s;
  return s.Push(piece) + s.Flush() == piece;
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ApiServer::ApiServer(ServeOptions options, RingAccess* ring)
    : o_(std::move(options)),
      ring_(ring),
      queue_(o_.max_sessions, o_.max_waiting),
      local_queue_(1, 16) {
  if (!o_.api_key.empty()) {
    const Sha256Digest d = Digest(o_.api_key);
    key_digest_.assign(d.begin(), d.end());
  }
  created_ = UnixNow();
}

Result<std::unique_ptr<ApiServer>> ApiServer::Start(const ServeOptions& o, RingAccess* ring) {
  if (o.max_sessions < 1)
    return Error("--max-sessions must be at least 1 (got {})", o.max_sessions);
  if (o.max_waiting < 0) return Error("--max-waiting must be >= 0 (got {})", o.max_waiting);
  std::unique_ptr<ApiServer> s(new ApiServer(o, ring));
  net::HttpServerOptions h;
  h.server.name = "serve";
  h.server.listen = o.listen;
  h.server.listen_fd = o.listen_fd;
  net::AdmissionPolicy& p = h.server.admission;
  p.open = {o.max_connections, std::min(o.max_connections, o.max_connections_per_address),
            std::max(1, o.max_connections / 2)};
  p.proven = {1, 1, 1};  // nothing proves itself here: API keys are checked per request
  net::SetHttpTimeouts(&p, o.request_timeout_ms, o.idle_timeout_ms);
  h.server_header = "kvasir-serve";
  h.max_body_bytes = o.max_body_bytes;
  h.error_body = [](int status, const std::string& code, const std::string& message) {
    ApiError e;
    e.status = status;
    e.type = status >= 500 ? "server_error" : "invalid_request_error";
    e.code = status == 413 ? "request_too_large" : status == 431 ? "headers_too_large" : code;
    e.message = message;
    if (status == 503) e.retry_after_s = 1;
    return ErrorResponse(e);
  };
  ApiServer* self = s.get();
  auto http =
      net::HttpServer::Start(h, [self](net::HttpServerRequest request, net::HttpResponder reply) {
        self->Handle(std::move(request), std::move(reply));
      });
  if (!http.ok()) return http.status();
  s->http_ = std::move(http).value();
  return s;
}

ApiServer::~ApiServer() { Stop(); }

void ApiServer::Stop() {
  if (http_) http_->Stop();
  queue_.Stop();
  local_queue_.Stop();
}

MetricsGauges ApiServer::Gauges() const {
  MetricsGauges g;
  g.ring_up = ring_->up();
  g.sessions_busy = queue_.running();
  g.sessions_deferred = queue_.waiting();
  g.max_sessions = queue_.max_running();
  g.stages = ring_->stages();
  return g;
}

bool ApiServer::Authorized(const net::HttpServerRequest& req) const {
  if (key_digest_.empty()) return true;
  auto it = req.headers.find("authorization");
  if (it == req.headers.end()) return false;
  const std::string& v = it->second;
  constexpr std::string_view kBearer = "Bearer ";
  const std::string given =
      v.compare(0, kBearer.size(), kBearer) == 0 ? v.substr(kBearer.size()) : std::string();
  // Digests of equal length, compared without an early exit: the time says nothing of the key.
  const Sha256Digest d = Digest(given);
  uint8_t diff = given.empty() ? 1 : 0;
  for (size_t i = 0; i < d.size(); ++i) {
    diff |= static_cast<uint8_t>(d[i] ^ static_cast<uint8_t>(key_digest_[i]));
  }
  return diff == 0;
}

void ApiServer::Handle(net::HttpServerRequest req, net::HttpResponder reply) {
  const std::string path = req.target.substr(0, req.target.find('?'));
  const Route* route = FindRoute(path);
  auto respond = [this, reply = std::move(reply),
                  label = std::string(route ? route->path : "other")](net::HttpServerResponse r) {
    if (!o_.cors_origin.empty()) {
      r.headers.emplace_back("Access-Control-Allow-Origin", o_.cors_origin);
      if (o_.cors_origin != "*") r.headers.emplace_back("Vary", "Origin");
    }
    metrics_.CountRequest(label, r.status);
    reply(std::move(r));
  };
  if (req.method == "OPTIONS") {  // a browser's preflight: no key is sent with it
    net::HttpServerResponse r;
    r.status = 204;
    r.headers.emplace_back("Allow", "GET, POST, OPTIONS");
    if (!o_.cors_origin.empty()) {
      r.headers.emplace_back("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      r.headers.emplace_back("Access-Control-Allow-Headers", "Authorization, Content-Type");
      r.headers.emplace_back("Access-Control-Max-Age", "600");
    }
    return respond(std::move(r));
  }
  if (route == nullptr) {
    ApiError e;
    e.status = 404;
    e.code = "unknown_url";
    e.message =
        fmt::format("no such endpoint: {} {}", req.method.substr(0, 16), path.substr(0, 128));
    return respond(ErrorResponse(e));
  }
  if (req.method != route->method) {
    ApiError e;
    e.status = 405;
    e.code = "method_not_allowed";
    e.message =
        fmt::format("{} takes {}, not {}", route->path, route->method, req.method.substr(0, 16));
    net::HttpServerResponse r = ErrorResponse(e);
    r.headers.emplace_back("Allow", route->method);
    return respond(std::move(r));
  }
  if (path != "/health" && !Authorized(req)) {
    ApiError e;
    e.status = 401;
    e.code = "invalid_api_key";
    e.message = "missing or incorrect API key: send the header 'Authorization: Bearer KEY'";
    net::HttpServerResponse r = ErrorResponse(e);
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return respond(std::move(r));
  }
  if (path == "/v1/completions") return Complete(req, Endpoint::kCompletions, respond);
  if (path == "/v1/chat/completions") return Complete(req, Endpoint::kChatCompletions, respond);
  if (path == "/health") return respond(Health());
  if (path == "/tokenize" || path == "/detokenize") {
    auto shared = std::make_shared<net::HttpServerRequest>(std::move(req));
    const bool tokenize = path == "/tokenize";
    const bool queued = local_queue_.Submit(
        [this, shared, respond, tokenize] {
          respond(tokenize ? Tokenize(*shared) : Detokenize(*shared));
        },
        [respond] { respond(ErrorResponse(Unavailable("the server is stopping"))); });
    if (!queued) {
      ApiError busy;
      busy.status = 429;
      busy.type = "rate_limit_error";
      busy.code = "too_many_requests";
      busy.message = "too many tokenize and detokenize requests at once; try again shortly";
      busy.retry_after_s = 1;
      respond(ErrorResponse(busy));
    }
    return;
  }
  if (path == "/metrics") {
    net::HttpServerResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics_.Render(Gauges());
    return respond(std::move(r));
  }
  net::HttpServerResponse r;
  r.content_type = "application/json";
  r.body = ModelsBody(o_.model_name, created_);
  respond(std::move(r));
}

void ApiServer::Complete(const net::HttpServerRequest& http, Endpoint endpoint,
                         const net::HttpResponder& respond) {
  const auto t_in = std::chrono::steady_clock::now();
  ApiError e;
  auto req = ParseCompletionRequest(http.body, endpoint, &e);
  if (!req) return respond(ErrorResponse(e));
  const auto t_parsed = std::chrono::steady_clock::now();
  if (!req->model.empty() && req->model != o_.model_name) {
    e.status = 404;
    e.code = "model_not_found";
    e.param = "model";
    e.message = fmt::format("the model '{}' is not served here (this server serves '{}')",
                            req->model, o_.model_name);
    return respond(ErrorResponse(e));
  }
  auto text = PromptText(*req, o_.chat_family, &e);
  if (!text) return respond(ErrorResponse(e));
  const auto t_templated = std::chrono::steady_clock::now();
  std::optional<ToolSyntax> tool_syntax;
  if (req->tools.active()) {  // a chat request: PromptText had a family
    if (!ApplyToolGrammar(*o_.chat_family, &*req, &e)) return respond(ErrorResponse(e));
    tool_syntax = ToolSyntaxFor(*o_.chat_family, req->tools.forced());
  }
  if (o_.tokenizer != nullptr) {
    for (const auto& [id, bias] : req->sampling.logit_bias) {
      if (id >= o_.tokenizer->n_vocab()) {
        return respond(ErrorResponse(
            BadRequest("invalid_value", "logit_bias",
                       fmt::format("'logit_bias': token {} is outside the vocabulary (0..{})", id,
                                   o_.tokenizer->n_vocab() - 1))));
      }
    }
  }
  if (!ring_->up())
    return respond(ErrorResponse(Unavailable("the ring is not up: " + ring_->why_down())));
  auto job = std::make_shared<AnswerJob>();
  job->arrived = std::chrono::steady_clock::now();
  std::random_device rd;
  const uint64_t seed = (uint64_t{rd()} << 32) | rd();
  job->generate = ToGenerate(*req, std::move(*text), seed);
  // The prompt now lives in the GENERATE alone: a waiting request holds it once.
  req->prompt.clear();
  req->messages.clear();
  job->request = std::move(*req);
  const std::string input = endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  if (Status s = ring::CheckEncodable(job->generate); !s.ok()) {
    return respond(ErrorResponse(BadRequest("context_length_exceeded", input, s.message())));
  }
  job->meta = {endpoint, NewAnswerId(endpoint), o_.model_name, UnixNow()};
  auto us = [](auto a, auto b) {
    return std::chrono::duration_cast<std::chrono::microseconds>(b - a).count();
  };
  TraceTiming("serve", "accepted",
              "req={} body_bytes={} prompt_bytes={} parse_us={} template_us={}", job->meta.id,
              http.body.size(), job->generate.prompt.size(), us(t_in, t_parsed),
              us(t_parsed, t_templated));
  job->tool_syntax = std::move(tool_syntax);
  job->reply = respond;
  const AnswerLimits limits{o_.stream_buffer_bytes};
  const bool queued =
      queue_.Submit([this, job, limits] { RunAnswer(*job, *ring_, metrics_, limits); },
                    [job] { job->reply(ErrorResponse(Unavailable("the server is stopping"))); });
  if (!queued) {
    ApiError busy;
    busy.status = 429;
    busy.type = "rate_limit_error";
    busy.code = "too_many_sessions";
    busy.message = fmt::format(
        "{} requests are running and {} waiting, the most this server "
        "takes (--max-sessions, --max-waiting); try again shortly",
        queue_.running(), queue_.waiting());
    busy.retry_after_s = 1;
    respond(ErrorResponse(busy));
  }
}

net::HttpServerResponse ApiServer::Health() const {
  if (!ring_->up()) {
    return ErrorResponse(Unavailable("the ring is not up yet: " + ring_->why_down()));
  }
  json stages = json::array();
  for (const wire::StageStats& s : ring_->stages()) {
    const std::string backend(s.backend, strnlen(s.backend, sizeof(s.backend)));
    stages.push_back({{"name", std::string(s.name, strnlen(s.name, sizeof(s.name)))},
                      {"layers", {s.window_first, s.window_last}},
                      {"backend", backend.empty() ? "unknown" : backend},
                      {"sessions_open", s.sessions_open},
                      {"decode_ms_per_token",
                       s.decode_rows > 0 ? s.decode_busy_ns / 1e6 / s.decode_rows : 0.0}});
  }
  return Json(
      200,
      {{"status", "ok"},
       {"model", o_.model_name},
       {"sessions",
        {{"busy", queue_.running()}, {"waiting", queue_.waiting()}, {"max", queue_.max_running()}}},
       {"stages", stages}});
}

net::HttpServerResponse ApiServer::Tokenize(const net::HttpServerRequest& http) const {
  ApiError e;
  auto req = ParseTokenizeRequest(http.body, &e);
  if (!req) return ErrorResponse(e);
  if (o_.tokenizer == nullptr) {
    e.status = 501;
    e.code = "no_vocabulary";
    e.message =
        "this server has no vocabulary to tokenize with: start kvasir serve with "
        "--vocab FILE (the model or a slice of it)";
    return ErrorResponse(e);
  }
  const std::vector<int32_t> ids =
      o_.tokenizer->Encode(req->content, req->add_special, req->parse_special);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (!req->with_pieces) {
      tokens.push_back(id);
      continue;
    }
    // As llama-server: the piece as text when it is valid UTF-8, else its bytes.
    const std::string piece = o_.tokenizer->TokenToPiece(id, /*special=*/true);
    json p =
        ValidUtf8(piece) ? json(piece) : json(std::vector<uint8_t>(piece.begin(), piece.end()));
    tokens.push_back({{"id", id}, {"piece", p}});
  }
  return Json(200, {{"tokens", tokens}});
}

net::HttpServerResponse ApiServer::Detokenize(const net::HttpServerRequest& http) const {
  ApiError e;
  auto ids = ParseDetokenizeRequest(http.body, &e);
  if (!ids) return ErrorResponse(e);
  if (o_.tokenizer == nullptr) {
    e.status = 501;
    e.code = "no_vocabulary";
    e.message =
        "this server has no vocabulary to detokenize with: start kvasir serve with "
        "--vocab FILE (the model or a slice of it)";
    return ErrorResponse(e);
  }
  for (size_t i = 0; i < ids->size(); ++i) {
    if ((*ids)[i] >= o_.tokenizer->n_vocab()) {
      return ErrorResponse(BadRequest("invalid_value", fmt::format("tokens[{}]", i),
                                      fmt::format("token {} is outside the vocabulary (0..{})",
                                                  (*ids)[i], o_.tokenizer->n_vocab() - 1)));
    }
  }
  return Json(200, {{"content", o_.tokenizer->Decode(*ids, /*special=*/true)}});
}

}  // namespace kvasir::serve
