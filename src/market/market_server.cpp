#include "market/market_server.h"

#include <algorithm>
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

// The header as HttpServerRequest names it (lowercase).
constexpr const char* kSignatureLower = "x-kvasir-signature";

}  // namespace

net::HttpServerResponse MarketServer::Answer(Shared& shared, const ApiRequest& r) {
  std::unique_lock<std::mutex> lock(shared.mu);
  const ApiResponse res = shared.api->Handle(r, UnixNow());
  lock.unlock();
  KV_LOG_DEBUG("market: {} {} {} -> {}", r.remote_ip, r.method, r.target.substr(0, 80), res.status);
  return ToHttp(res);
}

MarketServer::MarketServer(std::unique_ptr<net::HttpServer> http, std::shared_ptr<Shared> shared)
    : http_(std::move(http)), shared_(std::move(shared)) {}

MarketServer::~MarketServer() { Stop(); }

void MarketServer::Flusher(int interval_ms) {
  Store* store = shared_->api->store();
  std::unique_lock<std::mutex> lock(shared_->mu);
  while (!shared_->stopping) {
    shared_->wake.wait_for(lock, std::chrono::milliseconds(interval_ms));
    if (shared_->stopping) break;
    if (store->background_flush()) {
      // Taken and ended under the lock, written without it: requests are answered meanwhile.
      auto batch = store->TakeLeaseFlush(UnixNow());
      if (batch == nullptr) continue;
      lock.unlock();
      const Status written = store->WriteLeaseFlush(*batch);
      lock.lock();
      store->EndLeaseFlush(written, UnixNow());
      lock.unlock();
      if (!written.ok()) {
        KV_LOG_WARN("market: writing {} lease renewals: {} (they wait for the next flush)",
                    batch->size(), written.message());
      }
      batch.reset();  // thousands of entries freed without the lock
      lock.lock();
      continue;
    }
    if (Status s = shared_->api->FlushLeases(UnixNow()); !s.ok()) {
      KV_LOG_WARN("market: writing lease renewals: {} (they wait for the next flush)", s.message());
    }
  }
}

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
  if (api->lease_flush_s() > 0) {
    // Before any request: on SQLite the flush gets a connection of its own.
    auto background = api->store()->EnableBackgroundFlush();
    if (!background.ok()) return background.status();
  }
  auto shared = std::make_shared<Shared>();
  shared->api = api;
  if (o.verify_threads > 0) {
    shared->verifiers = std::make_unique<VerifyPool>(o.verify_threads, o.max_verify_waiting);
  }
  auto http =
      net::HttpServer::Start(h, [shared](net::HttpServerRequest req, net::HttpResponder reply) {
        ApiRequest r;
        r.method = std::move(req.method);
        r.target = std::move(req.target);
        r.headers = std::move(req.headers);
        r.body = std::move(req.body);
        r.remote_ip = std::move(req.remote_ip);
        if (!shared->verifiers || r.headers.count(kSignatureLower) == 0) {
          reply(Answer(*shared, r));
          return;
        }
        auto job = [shared, r = std::move(r), reply]() mutable {
          r.signature = shared->api->CheckSignature(r, UnixNow());
          reply(Answer(*shared, r));
        };
        if (!shared->verifiers->Submit(std::move(job))) {
          reply(ToHttp(ErrorResponse(503, "unavailable",
                                     "market: too many signed requests wait for their check")));
        }
      });
  if (!http.ok()) return http.status();
  std::unique_ptr<MarketServer> server(new MarketServer(std::move(http).value(), shared));
  if (api->lease_flush_s() <= 0) return server;  // every renewal is written at once
  // A quarter of the interval: a renewal waits at most about 1.25 intervals in memory.
  const int interval_ms = std::max(10, static_cast<int>(api->lease_flush_s() * 1000 / 4));
  server->flusher_ = std::thread([s = server.get(), interval_ms] { s->Flusher(interval_ms); });
  return server;
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
  // Answers what waits (to connections that are gone) before the API may go.
  if (shared_ && shared_->verifiers) shared_->verifiers->Stop();
  if (!flusher_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stopping = true;
  }
  shared_->wake.notify_all();
  flusher_.join();
  // No request is answered any more: what waits in memory is written now.
  if (Status s = shared_->api->FlushLeases(UnixNow(), /*force=*/true); !s.ok()) {
    KV_LOG_WARN("market: writing lease renewals at the stop: {}", s.message());
  }
}

}  // namespace kvasir::market
