#include "market/market_server.h"

#include <chrono>

#include "base/log.h"
#include "net/http_server.h"

namespace kvasir::market {

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {

net::HttpServerResponse ToHttp(const ApiResponse& a) {
  net::HttpServerResponse r;
  r.status = a.status;
  r.content_type = a.content_type;
  r.body = a.body;
  r.headers.emplace_back("Cache-Control", "no-store");
  if (!a.allow.empty()) r.headers.emplace_back("Allow", a.allow);
  r.proven = !a.verified_node.empty();
  return r;
}

}  // namespace

MarketServer::MarketServer(std::unique_ptr<net::HttpServer> http) : http_(std::move(http)) {}

MarketServer::~MarketServer() { Stop(); }

Result<std::unique_ptr<MarketServer>> MarketServer::Start(const MarketServerOptions& o,
                                                          MarketApi* api) {
  net::HttpServerOptions h;
  h.server.name = "market";
  h.server.listen = o.listen;
  h.server.tls_cert = o.tls_cert;
  h.server.tls_key = o.tls_key;
  net::AdmissionPolicy& p = h.server.admission;
  p.open = {o.max_connections, o.max_connections_per_address, std::max(1, o.max_connections / 2)};
  p.proven = {o.max_proven, o.max_proven_per_address, std::max(1, o.max_proven / 2)};
  if (o.request_timeout_ms < 1 || o.idle_timeout_ms < 1) {
    return Error("market: the request and idle timeouts must be at least 1 ms (got {} and {})",
                 o.request_timeout_ms, o.idle_timeout_ms);
  }
  net::SetHttpTimeouts(&p, o.request_timeout_ms, o.idle_timeout_ms);
  h.server_header = "kvasir-market";
  h.max_header_bytes = 8 * 1024;
  h.max_body_bytes = kMaxRequestBytes;
  h.error_body = [](int status, const std::string& code, const std::string& message) {
    return ToHttp(ErrorResponse(status, code, message));
  };
  auto http = net::HttpServer::Start(
      h, net::Synchronous([api](const net::HttpServerRequest& req) {
        ApiRequest r{req.method, req.target, req.headers, req.body, req.remote_ip};
        const ApiResponse res = api->Handle(r, UnixNow());
        KV_LOG_DEBUG("market: {} {} {} -> {}", req.remote_ip, r.method, r.target.substr(0, 80),
                     res.status);
        return ToHttp(res);
      }));
  if (!http.ok()) return http.status();
  return std::unique_ptr<MarketServer>(new MarketServer(std::move(http).value()));
}

uint16_t MarketServer::port() const { return http_->port(); }

MarketServerStats MarketServer::stats() const {
  const net::HttpServerStats h = http_->stats();
  MarketServerStats s;
  s.connections = h.server.accepted;
  s.requests = h.requests;
  s.refused = h.server.refused + h.server.expired + h.rejected;
  s.evicted = h.server.evicted;
  s.open = h.server.open;
  s.proven = h.server.proven;
  return s;
}

bool MarketServer::WaitFor(const std::function<bool(const MarketServerStats&)>& done,
                           int timeout_ms) const {
  return http_->WaitFor([&] { return done(stats()); }, timeout_ms);
}

void MarketServer::Stop() {
  if (http_) http_->Stop();
}

}  // namespace kvasir::market
