// The JSON the market answers with (docs/MARKET.md, "API"), built from the store's records.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "market/store.h"
#include "relay/edge_token.h"

namespace kvasir::market {

// "uncovered", "claimed", "serving" or "expiring" (no heartbeat for over half the lease).
std::string WindowStateName(const WindowState& w, int64_t epoch, double now, double lease_s);

nlohmann::json MapToJson(const std::vector<ModelState>& models, double now, double lease_s,
                         const std::string& relay_url);
nlohmann::json GrantToJson(const ClaimGrant& grant, double now);
// The neighbours of the heartbeat's claim, with relay edges (and this node's edge tokens, made
// with `relay_secret`; zeros without one) where either end of a link is behind NAT; for a
// standby behind NAT, its check edge ("check").
nlohmann::json HeartbeatToJson(const HeartbeatReply& reply, double now,
                               const std::string& relay_url, const std::string& relay_secret);
nlohmann::json BalancesToJson(const std::vector<Balance>& balances,
                              const std::vector<ReceiptRecord>& receipts);

// The relay edge id of the link from claim `pred` to claim `next`: "e<pred>-<next>".
std::string EdgeIdFor(int64_t pred_claim, int64_t next_claim);
// The relay edge id a standby behind NAT is checked through: "c<claim>". The market takes its
// predecessor side, the standby's stage keeps its successor side dialed.
std::string CheckEdgeIdFor(int64_t standby_claim);
// The token of `role` on `edge`, made with `relay_secret` (zeros without one).
relay::EdgeToken EdgeTokenFor(const std::string& relay_secret, const std::string& edge,
                              relay::Role role);
// {"via": "<relay_url>/edge/<edge>", "token": the hex token of `role` on `edge`}.
nlohmann::json EdgeJson(const std::string& relay_url, const std::string& relay_secret,
                        const std::string& edge, relay::Role role);

}  // namespace kvasir::market
