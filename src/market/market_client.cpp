#include "market/market_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "market/signed_request.h"

namespace kvasir::market {

StatusCode CodeForHttpStatus(int status) {
  switch (status) {
    case 401: return StatusCode::kUnauthenticated;
    case 403: return StatusCode::kForbidden;
    case 404: return StatusCode::kNotFound;
    case 409: return StatusCode::kConflict;
    case 413: return StatusCode::kTooLarge;
    default: return status >= 500 ? StatusCode::kUnavailable : StatusCode::kInvalidInput;
  }
}

Result<MarketClient> MarketClient::Create(std::string base_url,
                                          std::shared_ptr<const ring::NodeKey> key,
                                          net::HttpRequestOptions http) {
  while (!base_url.empty() && base_url.back() == '/') base_url.pop_back();
  KV_ASSIGN_OR_RETURN(net::Url url, net::ParseUrl(base_url));
  if (url.target != "/") {
    return Error("market URL {}: give the server only (http[s]://HOST[:PORT]), not a path",
                 base_url);
  }
  auto connections = std::make_shared<Connections>();
  connections->origin = std::move(url);
  connections->http = std::move(http);
  if (connections->origin.tls()) {
    // An unreadable --ca file is an error now, not at the first request.
    KV_RETURN_IF_ERROR(net::HttpSession::Create(connections->origin, connections->http).status());
  }
  return MarketClient(std::move(base_url), std::move(key), std::move(connections));
}

MarketClient MarketClient::WithKey(std::shared_ptr<const ring::NodeKey> key) const {
  return MarketClient(base_, std::move(key), connections_);
}

int MarketClient::connects() const { return connections_->connects.load(); }

Result<std::unique_ptr<net::HttpSession>> MarketClient::Take(bool fresh) const {
  if (!fresh) {
    std::lock_guard<std::mutex> lock(connections_->mu);
    if (!connections_->idle.empty()) {
      auto s = std::move(connections_->idle.back());
      connections_->idle.pop_back();
      return s;
    }
  }
  return net::HttpSession::Create(connections_->origin, connections_->http);
}

void MarketClient::GiveBack(std::unique_ptr<net::HttpSession> session) const {
  if (!session->connected()) return;
  std::lock_guard<std::mutex> lock(connections_->mu);
  if (connections_->idle.size() < kMaxIdleConnections) {
    connections_->idle.push_back(std::move(session));
  }
}

Result<nlohmann::json> MarketClient::Send(const std::string& method, const std::string& target,
                                          const std::string& body, bool sign) const {
  if (sign && key_ == nullptr) return Error("{} {}: needs a node key", method, target);
  net::HttpReply reply;
  // A kept connection the market closed while it idled (its idle deadline) takes the request
  // with it unread: the request goes once more on a new connection, signed anew (the market
  // refuses a signed request's nonce the second time).
  for (int attempt = 0;; ++attempt) {
    std::map<std::string, std::string> headers;
    if (sign) {
      const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
      int64_t signed_at = connections_->last_signed.load();
      while (
          !connections_->last_signed.compare_exchange_weak(signed_at, std::max(signed_at, now))) {
      }
      headers = SignRequest(*key_, method, target, body, std::max(signed_at, now));
    }
    KV_ASSIGN_OR_RETURN(std::unique_ptr<net::HttpSession> session, Take(/*fresh=*/attempt > 0));
    const int connects_before = session->connects();
    bool unanswered = false;
    auto sent = session->Send(method, target, headers, body, &unanswered);
    connections_->connects += session->connects() - connects_before;
    if (sent.ok()) {
      reply = std::move(sent).value();
      GiveBack(std::move(session));
      break;
    }
    if (!unanswered || attempt > 0) return sent.status();
  }
  nlohmann::json j = nlohmann::json::parse(reply.body, nullptr, false);
  if (reply.status >= 200 && reply.status < 300) {
    if (j.is_discarded()) {
      return Error("market {}: {} {}: the answer is not JSON", base_, method, target);
    }
    return j;
  }
  std::string message = reply.body.substr(0, 300);
  if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
      j["error"].contains("message") && j["error"]["message"].is_string()) {
    message = j["error"]["message"].get<std::string>();
  }
  return Status::Error(
      fmt::format("market {}: {} {}: HTTP {}: {}", base_, method, target, reply.status, message),
      CodeForHttpStatus(reply.status));
}

Result<nlohmann::json> MarketClient::Get(const std::string& target) const {
  return Send("GET", target, "", false);
}
Result<nlohmann::json> MarketClient::PostSigned(const std::string& target,
                                                const nlohmann::json& body) const {
  return Send("POST", target, body.dump(), true);
}
Result<nlohmann::json> MarketClient::DeleteSigned(const std::string& target) const {
  return Send("DELETE", target, "", true);
}
Result<nlohmann::json> MarketClient::Post(const std::string& target,
                                          const nlohmann::json& body) const {
  return Send("POST", target, body.dump(), false);
}

}  // namespace kvasir::market
