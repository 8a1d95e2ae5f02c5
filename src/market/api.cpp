#include "market/api.h"

#include <fmt/format.h>

#include <arpa/inet.h>

#include <charconv>
#include <optional>
#include <utility>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "market/map_json.h"
#include "market/signed_request.h"
#include "net/stream.h"
#include "relay/edge_token.h"
#include "ring/receipt.h"

namespace kvasir::market {
namespace {

using nlohmann::json;

constexpr int kMaxJsonDepth = 16;

// Deep nesting is refused before parsing, so no parser recursion or destructor can be driven by
// a body of a million '['.
Status CheckDepth(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return Error("body: JSON nested deeper than {}", kMaxJsonDepth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return Status::Ok();
}

Result<json> ParseBody(const std::string& body) {
  KV_RETURN_IF_ERROR(CheckDepth(body));
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return Error("body: not valid JSON");
  if (!j.is_object()) return Error("body: must be a JSON object");
  return j;
}

Result<std::string> StringField(const json& j, const char* name, size_t max_chars,
                                bool required = true) {
  auto it = j.find(name);
  if (it == j.end()) {
    if (!required) return std::string();
    return Error("field '{}': missing", name);
  }
  if (!it->is_string()) return Error("field '{}': must be a string", name);
  const auto& s = it->get_ref<const std::string&>();
  if (s.size() > max_chars) return Error("field '{}': longer than {} characters", name, max_chars);
  return s;
}

Result<int64_t> IntField(const json& j, const char* name, int64_t lo, int64_t hi) {
  auto it = j.find(name);
  if (it == j.end()) return Error("field '{}': missing", name);
  if (!it->is_number_integer()) return Error("field '{}': must be an integer", name);
  const int64_t v = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)
                        ? INT64_MAX
                        : it->get<int64_t>();
  if (v < lo || v > hi) return Error("field '{}': must be from {} to {}, not {}", name, lo, hi, v);
  return v;
}

Result<bool> BoolField(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return false;
  if (!it->is_boolean()) return Error("field '{}': must be true or false", name);
  return it->get<bool>();
}

ApiResponse Json(int status, const json& j) {
  ApiResponse r;
  r.status = status;
  r.body = j.dump();
  return r;
}

// An IPv4 or IPv6 literal, or a DNS name (letters, digits and '-' in dot-separated labels of 1 to
// 63 characters, at most 253 in all): what the market can dial to check the holder.
bool DialableHost(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1 || inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return true;
  }
  if (host.empty() || host.size() > 253) return false;
  size_t label = 0;
  for (char c : host) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-';
    if (!ok || ++label > 63) return false;
  }
  return label > 0;
}

// "HOST:PORT"; an empty or wildcard host becomes the request's source address.
Result<std::string> CompleteAddress(const std::string& text, const std::string& remote_ip) {
  std::string host;
  uint16_t port = 0;
  if (Status s = net::ParseHostPort(text, &host, &port); !s.ok()) {
    return Error("field 'address': {}", s.message());
  }
  if (port == 0) return Error("field 'address': port 0 cannot be dialed");
  const bool wildcard = host.empty() || host == "0.0.0.0" || host == "::";
  if (!wildcard && !DialableHost(host)) {
    return Error("field 'address': '{}' is neither an IP address nor a host name", host);
  }
  if (wildcard) {
    if (remote_ip.empty()) return Error("field 'address': no host, and the source is unknown");
    host = remote_ip;
  }
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

// How long a nonce is remembered: as long as its request's time is accepted, on either side.
double NonceKeepSeconds(const MarketConfig& config) {
  return 2.0 * static_cast<double>(config.clock_skew_s);
}

// On success also names the node in `*verified`. With `defer_nonce`, the nonce is not recorded
// here: the caller records it in the transaction of the request's work (RequestNonce).
Result<SignedBy> Authenticate(Store* store, const MarketConfig& config, const ApiRequest& req,
                              double now, std::string* verified, bool defer_nonce = false) {
  KV_ASSIGN_OR_RETURN(SignedBy by,
                      req.signature.has_value()
                          ? *req.signature
                          : VerifySignedRequest(req.headers, req.method, req.target, req.body,
                                                static_cast<int64_t>(now), config.clock_skew_s));
  if (defer_nonce) {
    *verified = by.node_hex;
    return by;
  }
  KV_ASSIGN_OR_RETURN(bool fresh,
                      store->UseNonce(by.node_hex, by.nonce, now, NonceKeepSeconds(config)));
  if (!fresh) {
    return Error(StatusCode::kUnauthenticated,
                 "X-Kvasir-Nonce: used before by node {}: a replayed request", by.node_hex.substr(0, 8));
  }
  *verified = by.node_hex;
  return by;
}

bool IsHex(const std::string& s, size_t digits) {
  return s.size() == digits && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// The optional "proof": {"nonce": 32 hex, "digests": [64 hex, ...]} of a heartbeat.
Result<std::optional<ProofAnswer>> ProofField(const json& j) {
  auto it = j.find("proof");
  if (it == j.end()) return std::optional<ProofAnswer>();
  if (!it->is_object()) return Error("field 'proof': must be an object");
  ProofAnswer p;
  KV_ASSIGN_OR_RETURN(p.nonce, StringField(*it, "nonce", 2 * kProofNonceBytes));
  if (!IsHex(p.nonce, 2 * kProofNonceBytes)) {
    return Error("field 'proof.nonce': must be {} lowercase hex digits", 2 * kProofNonceBytes);
  }
  auto d = it->find("digests");
  if (d == it->end() || !d->is_array() || d->size() > 64) {
    return Error("field 'proof.digests': must be an array of at most 64 digests");
  }
  for (const json& x : *d) {
    if (!x.is_string() || !IsHex(x.get<std::string>(), 64)) {
      return Error("field 'proof.digests': each must be 64 lowercase hex digits");
    }
    p.digests.push_back(x.get<std::string>());
  }
  return std::optional<ProofAnswer>(std::move(p));
}

std::string QueryValue(const std::string& query, const std::string& key) {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t end = query.find('&', pos);
    if (end == std::string::npos) end = query.size();
    const std::string_view part(query.data() + pos, end - pos);
    if (part.substr(0, key.size() + 1) == key + "=") return std::string(part.substr(key.size() + 1));
    pos = end + 1;
  }
  return "";
}

}  // namespace

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameChars) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

ApiResponse ErrorResponse(int http_status, const std::string& code, const std::string& message) {
  return Json(http_status, {{"error", {{"code", code}, {"message", message}}}});
}

ApiResponse ErrorResponse(const Status& status) {
  switch (status.code()) {
    case StatusCode::kUnauthenticated: return ErrorResponse(401, "unauthenticated", status.message());
    case StatusCode::kForbidden: return ErrorResponse(403, "forbidden", status.message());
    case StatusCode::kNotFound: return ErrorResponse(404, "not_found", status.message());
    case StatusCode::kConflict: return ErrorResponse(409, "conflict", status.message());
    case StatusCode::kTooLarge: return ErrorResponse(413, "too_large", status.message());
    case StatusCode::kUnavailable:
    case StatusCode::kTimeout: return ErrorResponse(503, "unavailable", status.message());
    default: return ErrorResponse(400, "bad_request", status.message());
  }
}

MarketApi::MarketApi(Store* store, MarketConfig config, CheckQueue* checks)
    : store_(store), config_(std::move(config)), checks_(checks) {
  store_->set_lease_s(config_.lease_s);
  store_->set_lease_flush_s(config_.lease_flush_s);
  store_->set_eviction(config_.eviction);
  store_->set_audit(config_.audit);
  store_->set_check_standbys(checks_ != nullptr);
}

Status MarketApi::FlushLeases(double now, bool force) {
  if (!force && !store_->LeaseFlushDue(now)) return Status::Ok();
  return store_->FlushLeases(now);
}

void MarketApi::RequestChecks(const std::string& model_id, const RingState& ring) {
  if (checks_ == nullptr || !ring.complete) return;
  RequestStandbyChecks(ring);
  if (!ring.serving || ring.ready) return;
  for (const WindowState& w : ring.windows) {
    const ClaimInfo& c = *w.claim;  // a serving ring is complete
    if (!c.checked() || c.verified_epoch == ring.epoch) continue;
    CheckJob job;
    job.claim = c.id;
    job.epoch = ring.epoch;
    job.node = c.node;
    job.address = c.address;
    job.head = w.window == 0;
    job.model_id = model_id;
    job.last = w.last;
    checks_->Request(job);
  }
}

void MarketApi::RequestStandbyChecks(const RingState& ring) {
  const size_t n = ring.windows.size();
  for (size_t i = 0; i < n; ++i) {
    const WindowState& w = ring.windows[i];
    for (const ClaimInfo& s : w.standbys) {
      if (!s.proven || s.serving_epoch != ring.epoch || s.verified_epoch == ring.epoch) continue;
      CheckJob job;
      job.claim = s.id;
      job.epoch = ring.epoch;
      job.node = s.node;
      job.address = s.address;
      job.last = w.last;
      if (s.behind_nat) {
        if (config_.relay_url.empty()) continue;
        // Through the relay, on an edge of its own that its stage keeps dialed whatever its
        // links: a predecessor that adopted it holds their edge, where the market's dial would
        // be refused (the relay pairs one end of each role).
        const std::string edge = CheckEdgeIdFor(s.id);
        job.via = fmt::format("{}/edge/{}", config_.relay_url, edge);
        job.token = EdgeTokenFor(config_.relay_secret, edge, relay::Role::kPredecessorSide);
      }
      checks_->Request(job);
    }
  }
}

Result<SignedBy> MarketApi::CheckSignature(const ApiRequest& request, double now) const {
  return VerifySignedRequest(request.headers, request.method, request.target, request.body,
                             static_cast<int64_t>(now), config_.clock_skew_s);
}

ApiResponse MarketApi::Handle(const ApiRequest& request, double now) {
  if (request.body.size() > kMaxRequestBytes) {
    return ErrorResponse(413, "too_large",
                         fmt::format("request body of {} bytes; at most {}", request.body.size(),
                                     kMaxRequestBytes));
  }
  verified_node_.clear();
  try {
    ApiResponse r = Route(request, now);
    r.verified_node = std::exchange(verified_node_, {});
    return r;
  } catch (const std::exception& e) {
    // A JSON accessor or allocation failed on something the checks above let through: a bug,
    // but one request's, not the market's.
    KV_LOG_ERROR("market: {} {}: {}", request.method, request.target.substr(0, 80), e.what());
    return ErrorResponse(500, "internal", "internal error");
  }
}

ApiResponse MarketApi::Route(const ApiRequest& req, double now) {
  const size_t q = req.target.find('?');
  const std::string path = req.target.substr(0, q);
  const std::string query = q == std::string::npos ? "" : req.target.substr(q + 1);
  auto method_not_allowed = [](const char* allow) {
    ApiResponse r = ErrorResponse(405, "method_not_allowed", fmt::format("use {}", allow));
    r.allow = allow;
    return r;
  };
  if (path == "/" || path == "/index.html") {
    if (req.method != "GET" && req.method != "HEAD") return method_not_allowed("GET");
    ApiResponse r;
    r.content_type = "text/html; charset=utf-8";
    r.body = MarketPage();
    return r;
  }
  if (path == "/health") return req.method == "GET" ? Health(now) : method_not_allowed("GET");
  if (path == "/v1/map") return req.method == "GET" ? Map(now) : method_not_allowed("GET");
  if (path == "/v1/balances") {
    return req.method == "GET" ? Balances(query) : method_not_allowed("GET");
  }
  if (path == "/v1/claims") return req.method == "POST" ? Claim(req, now) : method_not_allowed("POST");
  if (path == "/v1/heartbeat") {
    return req.method == "POST" ? Heartbeat(req, now) : method_not_allowed("POST");
  }
  if (path == "/v1/receipts") {
    return req.method == "POST" ? Receipt(req, now) : method_not_allowed("POST");
  }
  constexpr std::string_view kClaimPrefix = "/v1/claims/";
  if (path.starts_with(kClaimPrefix)) {
    if (req.method != "DELETE") return method_not_allowed("DELETE");
    return Release(req, path.substr(kClaimPrefix.size()), now);
  }
  constexpr std::string_view kRingPrefix = "/v1/rings/";
  if (path.starts_with(kRingPrefix)) {
    if (req.method != "GET") return method_not_allowed("GET");
    return Ring(path.substr(kRingPrefix.size()), req.remote_ip, now);
  }
  return ErrorResponse(404, "not_found", fmt::format("no such endpoint: {}", path.substr(0, 100)));
}

ApiResponse MarketApi::Health(double now) {
  auto counts = store_->Counts(now);
  if (!counts.ok()) return ErrorResponse(counts.status().WithCode(StatusCode::kUnavailable));
  return Json(200, {{"ok", true},
                    {"models", counts->first},
                    {"claims", counts->second},
                    {"time", static_cast<int64_t>(now)}});
}

ApiResponse MarketApi::Map(double now) {
  auto models = store_->Map(now);
  if (!models.ok()) return ErrorResponse(models.status().WithCode(StatusCode::kUnavailable));
  return Json(200, MapToJson(*models, now, config_.lease_s, config_.relay_url));
}

ApiResponse MarketApi::Claim(const ApiRequest& req, double now) {
  auto by = Authenticate(store_, config_, req, now, &verified_node_);
  if (!by.ok()) return ErrorResponse(by.status());
  auto body = ParseBody(req.body);
  if (!body.ok()) return ErrorResponse(body.status());
  ClaimRequest c;
  c.node = by->node_hex;
  auto model = StringField(*body, "model", kMaxNameChars);
  if (!model.ok()) return ErrorResponse(model.status());
  if (!ValidName(*model)) {
    return ErrorResponse(400, "bad_request", "field 'model': 1-64 characters from A-Z a-z 0-9 . _ -");
  }
  c.model = *model;
  auto ring = IntField(*body, "ring", 0, 1 << 20);
  if (!ring.ok()) return ErrorResponse(ring.status());
  auto window = IntField(*body, "window", 0, 1 << 20);
  if (!window.ok()) return ErrorResponse(window.status());
  c.ring = static_cast<int>(*ring);
  c.window = static_cast<int>(*window);
  auto nat = BoolField(*body, "behind_nat");
  if (!nat.ok()) return ErrorResponse(nat.status());
  c.behind_nat = *nat;
  auto standby = BoolField(*body, "standby");
  if (!standby.ok()) return ErrorResponse(standby.status());
  c.standby = *standby;
  auto address = StringField(*body, "address", kMaxAddressChars, /*required=*/false);
  if (!address.ok()) return ErrorResponse(address.status());
  if (c.behind_nat) {
    if (!address->empty()) {
      return ErrorResponse(400, "bad_request", "field 'address': not with behind_nat");
    }
    if (config_.relay_url.empty()) {
      return ErrorResponse(400, "bad_request",
                           "field 'behind_nat': this market has no relay (--relay), so nodes "
                           "that accept no inbound connections cannot join");
    }
  } else {
    if (address->empty()) {
      return ErrorResponse(400, "bad_request", "field 'address': missing (or behind_nat: true)");
    }
    auto full = CompleteAddress(*address, req.remote_ip);
    if (!full.ok()) return ErrorResponse(full.status());
    c.address = *full;
  }
  auto grant = store_->Claim(c, now, config_.lease_s);
  if (!grant.ok()) return ErrorResponse(grant.status());
  return Json(grant->renewed ? 200 : 201, GrantToJson(*grant, now));
}

ApiResponse MarketApi::Heartbeat(const ApiRequest& req, double now) {
  // The nonce goes into the heartbeat's own transaction (one transaction per heartbeat), unless
  // the body answers audits, which are a transaction of their own before it.
  auto by = Authenticate(store_, config_, req, now, &verified_node_, /*defer_nonce=*/true);
  if (!by.ok()) return ErrorResponse(by.status());
  const RequestNonce nonce{by->nonce, NonceKeepSeconds(config_), by->time};
  // Every answer but a heartbeat's own records the nonce on its own first (a replayed request is
  // refused as such, whatever else is wrong with it).
  auto use_nonce = [&]() -> Status {
    KV_ASSIGN_OR_RETURN(bool fresh, store_->UseNonce(by->node_hex, by->nonce, now, nonce.keep_s));
    if (!fresh) {
      return Error(StatusCode::kUnauthenticated,
                   "X-Kvasir-Nonce: used before by node {}: a replayed request",
                   by->node_hex.substr(0, 8));
    }
    return Status::Ok();
  };
  auto refuse = [&](ApiResponse bad) {
    if (Status s = use_nonce(); !s.ok()) return ErrorResponse(s);
    return bad;
  };
  auto body = ParseBody(req.body);
  if (!body.ok()) return refuse(ErrorResponse(body.status()));
  auto claim = IntField(*body, "claim", 1, INT64_MAX);
  if (!claim.ok()) return refuse(ErrorResponse(claim.status()));
  auto epoch = IntField(*body, "serving_epoch", -1, INT64_MAX);
  if (!epoch.ok()) return refuse(ErrorResponse(epoch.status()));
  auto proof = ProofField(*body);
  if (!proof.ok()) return refuse(ErrorResponse(proof.status()));
  auto answers = ParseAuditAnswers(*body);
  if (!answers.ok()) return refuse(ErrorResponse(400, "bad_request", answers.status().message()));
  const bool own_nonce = !answers->empty();
  if (own_nonce) {
    if (Status s = use_nonce(); !s.ok()) return ErrorResponse(s);
    // Before the heartbeat: a failed audit evicts the claim, and the heartbeat then says so.
    if (Status s = store_->AnswerAudits(by->node_hex, *answers, now); !s.ok()) {
      return ErrorResponse(s);
    }
  }
  auto reply =
      store_->Heartbeat(by->node_hex, *claim, *epoch, now, config_.lease_s,
                        proof->has_value() ? &**proof : nullptr, own_nonce ? nullptr : &nonce);
  if (!reply.ok()) return ErrorResponse(reply.status());
  RequestChecks(reply->model_id, reply->ring);
  return Json(200, HeartbeatToJson(*reply, now, config_.relay_url, config_.relay_secret));
}

ApiResponse MarketApi::Release(const ApiRequest& req, const std::string& id, double now) {
  int64_t claim = 0;
  auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), claim);
  if (id.empty() || ec != std::errc() || end != id.data() + id.size() || claim < 1) {
    return ErrorResponse(400, "bad_request", "claim id in the path: must be a positive integer");
  }
  auto by = Authenticate(store_, config_, req, now, &verified_node_);
  if (!by.ok()) return ErrorResponse(by.status());
  if (Status s = store_->Release(by->node_hex, claim, now); !s.ok()) return ErrorResponse(s);
  return Json(200, {{"released", claim}});
}

ApiResponse MarketApi::Ring(const std::string& model, const std::string& remote_ip, double now) {
  if (!ValidName(model)) {
    return ErrorResponse(400, "bad_request", "model name in the path: 1-64 characters from A-Z a-z 0-9 . _ -");
  }
  auto picked = store_->PickRing(model, remote_ip, now);
  if (!picked.ok()) return ErrorResponse(picked.status());
  const auto& [m, r] = *picked;
  const ClaimInfo& head = *r.windows.at(0).claim;
  return Json(200, {{"model", m.name},
                    {"model_id", m.model_id},
                    {"ring", r.ring},
                    {"epoch", r.epoch},
                    {"head", {{"node", head.node}, {"address", head.address}}}});
}

ApiResponse MarketApi::Receipt(const ApiRequest& req, double now) {
  auto body = ParseBody(req.body);
  if (!body.ok()) return ErrorResponse(body.status());
  auto hex = StringField(*body, "receipt",
                         2 * (sizeof(wire::ReceiptBody) + sizeof(wire::ClientCount) +
                              size_t{wire::kMaxReceiptLines} * sizeof(wire::ReceiptLine)));
  if (!hex.ok()) return ErrorResponse(hex.status());
  auto bytes = FromHex(*hex);
  if (!bytes.ok()) {
    return ErrorResponse(400, "bad_request",
                         fmt::format("field 'receipt': {}", bytes.status().message()));
  }
  const std::span<const uint8_t> payload(reinterpret_cast<const uint8_t*>(bytes->data()),
                                         bytes->size());
  auto receipt = ring::ParseReceipt(payload);
  if (!receipt.ok()) return ErrorResponse(422, "refused_receipt", receipt.status().message());
  // A client's count, once its signature checks (in `verify` below), caps the credited count;
  // lines that disagree are left as they are for the store to refuse.
  const uint64_t creditable = ring::CreditableTokens(*receipt);
  std::vector<ReceiptShare> shares;
  for (const ring::ReceiptLine& l : receipt->lines) {
    const uint64_t tokens = l.tokens == receipt->lines[0].tokens ? creditable : l.tokens;
    shares.push_back({ring::PublicKeyHex(l.node), static_cast<int>(l.first),
                      static_cast<int>(l.last), tokens, ring::DigestHex(l.rows_root)});
  }
  const std::string model_id(reinterpret_cast<const char*>(receipt->model_id.data()),
                             receipt->model_id.size());
  const ring::Receipt& parsed = *receipt;
  auto rec = store_->CreditReceipt(ring::ReceiptIdHex(parsed), ToHex(model_id), shares, *bytes, now,
                                   [&parsed] { return ring::VerifyReceipt(parsed); });
  if (!rec.ok()) {
    if (rec.status().code() == StatusCode::kUnavailable) return ErrorResponse(rec.status());
    return ErrorResponse(422, "refused_receipt", rec.status().message());
  }
  json credited = json::array();
  for (const CreditLine& l : rec->lines) {
    credited.push_back({{"node", l.node}, {"work", l.work}, {"credit", l.credit}});
  }
  return Json(200, {{"receipt", rec->id}, {"credited", credited}});
}

ApiResponse MarketApi::Balances(const std::string& query) {
  std::string node = QueryValue(query, "node");
  if (!node.empty()) {
    auto key = ring::ParsePublicKey(node);
    if (!key.ok()) {
      return ErrorResponse(400, "bad_request", fmt::format("query 'node': {}", key.status().message()));
    }
    node = ring::PublicKeyHex(*key);  // the store keeps lowercase keys
  }
  auto balances = store_->Balances();
  if (!balances.ok()) return ErrorResponse(balances.status().WithCode(StatusCode::kUnavailable));
  auto receipts = store_->Receipts(node, 100);
  if (!receipts.ok()) return ErrorResponse(receipts.status().WithCode(StatusCode::kUnavailable));
  return Json(200, BalancesToJson(*balances, *receipts));
}

}  // namespace kvasir::market
