// A client of the market's API (docs/MARKET.md): JSON over HTTP(S), requests signed with the
// node key where the API demands it, answers turned into Status codes a caller can branch on.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "net/http_request.h"
#include "ring/node_key.h"

namespace kvasir::market {

class MarketClient {
 public:
  // `base_url`: "http://host:port" (a trailing '/' is ignored). `key` may be null for clients
  // that only read (map, rings, receipts).
  static Result<MarketClient> Create(std::string base_url,
                                     std::shared_ptr<const ring::NodeKey> key,
                                     net::HttpRequestOptions http = {});

  Result<nlohmann::json> Get(const std::string& target) const;
  // Signed with the node key (which must be set).
  Result<nlohmann::json> PostSigned(const std::string& target, const nlohmann::json& body) const;
  Result<nlohmann::json> DeleteSigned(const std::string& target) const;
  // Unsigned POST (receipts prove themselves).
  Result<nlohmann::json> Post(const std::string& target, const nlohmann::json& body) const;

  const std::string& url() const { return base_; }

 private:
  MarketClient(std::string base, std::shared_ptr<const ring::NodeKey> key,
               net::HttpRequestOptions http)
      : base_(std::move(base)), key_(std::move(key)), http_(std::move(http)) {}
  Result<nlohmann::json> Send(const std::string& method, const std::string& target,
                              const std::string& body, bool sign) const;
  std::string base_;
  std::shared_ptr<const ring::NodeKey> key_;
  net::HttpRequestOptions http_;
};

// The Status code for an HTTP status of the market: 401 kUnauthenticated, 403 kForbidden, 404
// kNotFound, 409 kConflict, 413 kTooLarge, 5xx kUnavailable, other 4xx kInvalidInput.
StatusCode CodeForHttpStatus(int status);

}  // namespace kvasir::market
