// The market's HTTP API (docs/MARKET.md) as a pure function of a request: routing, body limits,
// JSON parsing with every field checked, signatures and nonces, and the answers. Knows nothing of
// sockets (market_server.h does the HTTP), so tests and the fuzzer call it directly.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "market/ring_check.h"
#include "market/signed_request.h"
#include "market/store.h"

namespace kvasir::market {

inline constexpr size_t kMaxRequestBytes = size_t{1} << 20;  // 1 MiB
inline constexpr size_t kMaxNameChars = 64;
inline constexpr size_t kMaxAddressChars = 255;

struct ApiRequest {
  std::string method;                          // "GET", "POST", "DELETE", ...
  std::string target;                          // "/v1/claims/17?x=y"
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;
  std::string remote_ip;  // completes an address with an empty or wildcard host
  // The check of the request's signature when the caller made it before (CheckSignature, on a
  // thread of its own); without it, Handle checks the signature itself.
  std::optional<Result<SignedBy>> signature = std::nullopt;
};

struct ApiResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string allow;  // for 405
  // The node (64 hex digits) whose signature verified on this request, with a fresh nonce; empty
  // for unsigned or refused ones. The server gives such a connection a place of its own.
  std::string verified_node;
};

struct MarketConfig {
  double lease_s = 30;
  int64_t clock_skew_s = 120;
  std::string relay_url;     // "wss://relay.example.org" (no path), or empty
  std::string relay_secret;  // the relay's secret, or empty (zero tokens)
  EvictionPolicy eviction;   // when claims that do not serve are evicted
  AuditPolicy audit;         // which credited sessions are audited, and the penalties
  // Renewals that change nothing but a lease are written together at most this many seconds
  // after they were answered (Store::set_lease_flush_s); 0 writes each at once.
  double lease_flush_s = 1;
};

class MarketApi {
 public:
  // `checks` receives the checks of holders a ring needs before it is ready (ring_check.h); with
  // none, no ring ever becomes ready. Both must outlive the API. Sets the store's lease.
  MarketApi(Store* store, MarketConfig config, CheckQueue* checks = nullptr);
  // Answers one request as of `now` (Unix seconds). Never throws, whatever the bytes.
  ApiResponse Handle(const ApiRequest& request, double now);
  // Checks the signature of `request` as of `now` (VerifySignedRequest with the configured clock
  // skew; not its nonce, which Handle checks). Thread-safe, touches no store: a server may call it
  // on other threads and pass the outcome in ApiRequest::signature.
  Result<SignedBy> CheckSignature(const ApiRequest& request, double now) const;
  // Writes the renewals waiting in memory once their flush is due (`force`: now, as at a stop).
  // To be called on the thread that calls Handle, or under the same lock.
  Status FlushLeases(double now, bool force = false);
  double lease_flush_s() const { return config_.lease_flush_s; }
  // The store, for a server that writes its flush on a thread of its own (Store::TakeLeaseFlush;
  // under the same lock as Handle, but WriteLeaseFlush).
  Store* store() const { return store_; }

 private:
  ApiResponse Route(const ApiRequest& request, double now);
  ApiResponse Map(double now);
  ApiResponse Claim(const ApiRequest& request, double now);
  ApiResponse Heartbeat(const ApiRequest& request, double now);
  ApiResponse Release(const ApiRequest& request, const std::string& id, double now);
  ApiResponse Ring(const std::string& model, const std::string& remote_ip, double now);
  ApiResponse Receipt(const ApiRequest& request, double now);
  ApiResponse Balances(const std::string& query);
  ApiResponse Health(double now);
  // Asks for the checks `ring` still needs: once every holder serves its epoch, each holder with
  // an address that has not passed a check for that epoch.
  void RequestChecks(const std::string& model_id, const RingState& ring);
  // Asks, once a ring is complete, for the check of each proven standby that serves its epoch (up
  // and waiting to be adopted) and has not passed one for it: dialed at its address, or through
  // the relay when behind NAT. A standby promoted needs its last check passed (standby.cpp). A
  // standby behind NAT is dialed once per edge: a pass carries over to later epochs while its
  // window's predecessor is the same claim.
  void RequestStandbyChecks(const RingState& ring);
  Store* store_;
  MarketConfig config_;
  CheckQueue* checks_;
  std::string verified_node_;  // set by a request's signature check; moved into its response
};

// {"error": {"code": ..., "message": ...}} with the HTTP status for a Status's code.
ApiResponse ErrorResponse(const Status& status);
ApiResponse ErrorResponse(int http_status, const std::string& code, const std::string& message);

// 1-64 characters from A-Z a-z 0-9 . _ -
bool ValidName(const std::string& name);

// The live page (GET /).
const std::string& MarketPage();

}  // namespace kvasir::market
