// A client of the market's API (docs/MARKET.md): JSON over HTTP(S), requests signed with the
// node key where the API demands it, answers turned into Status codes a caller can branch on.
// Requests go over kept-alive connections (net::HttpSession), which copies of a client and
// clients made with WithKey share: each request takes an idle one or opens one, and gives it back
// after its answer. Thread-safe: requests from several threads each get a connection of their own.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "net/http_request.h"
#include "ring/node_key.h"

namespace kvasir::market {

class MarketClient {
 public:
  // `base_url`: "http://host:port" (a trailing '/' is ignored). `key` may be null for clients
  // that only read (map, rings, receipts).
  static Result<MarketClient> Create(std::string base_url, std::shared_ptr<const ring::NodeKey> key,
                                     net::HttpRequestOptions http = {});

  Result<nlohmann::json> Get(const std::string& target) const;
  // Signed with the node key (which must be set).
  Result<nlohmann::json> PostSigned(const std::string& target, const nlohmann::json& body) const;
  Result<nlohmann::json> DeleteSigned(const std::string& target) const;
  // Unsigned POST (receipts prove themselves).
  Result<nlohmann::json> Post(const std::string& target, const nlohmann::json& body) const;

  // A client of the same market that signs with `key`, over this client's connections (many
  // simulated nodes in one process share a few connections, as market_load does).
  MarketClient WithKey(std::shared_ptr<const ring::NodeKey> key) const;

  const std::string& url() const { return base_; }
  // Connections opened so far by this client and those sharing its connections.
  int connects() const;

  // At most this many idle connections are kept; more are closed after their answer.
  static constexpr size_t kMaxIdleConnections = 4;

 private:
  // Idle kept-alive connections to the market.
  struct Connections {
    net::Url origin;
    net::HttpRequestOptions http;
    std::mutex mu;
    std::vector<std::unique_ptr<net::HttpSession>> idle;  // guarded by mu
    std::atomic<int> connects{0};
    // The latest time a request was signed with: a clock that steps back signs no earlier one
    // (the market refuses a heartbeat signed before its claim's last: docs/MARKET.md).
    std::atomic<int64_t> last_signed{0};
  };
  MarketClient(std::string base, std::shared_ptr<const ring::NodeKey> key,
               std::shared_ptr<Connections> connections)
      : base_(std::move(base)), key_(std::move(key)), connections_(std::move(connections)) {}
  Result<nlohmann::json> Send(const std::string& method, const std::string& target,
                              const std::string& body, bool sign) const;
  Result<std::unique_ptr<net::HttpSession>> Take(bool fresh) const;
  void GiveBack(std::unique_ptr<net::HttpSession> session) const;
  std::string base_;
  std::shared_ptr<const ring::NodeKey> key_;
  std::shared_ptr<Connections> connections_;
};

// The Status code for an HTTP status of the market: 401 kUnauthenticated, 403 kForbidden, 404
// kNotFound, 409 kConflict, 413 kTooLarge, 5xx kUnavailable, other 4xx kInvalidInput.
StatusCode CodeForHttpStatus(int status);

}  // namespace kvasir::market
