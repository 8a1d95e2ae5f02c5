#include "market/map_json.h"

#include <fmt/format.h>

#include <cmath>

#include "market/signed_request.h"
#include "relay/edge_token.h"

namespace kvasir::market {
namespace {

using nlohmann::json;

double Seconds(double s) { return std::round(std::max(0.0, s) * 10) / 10; }

json PeerJson(const ClaimInfo& peer, const ClaimInfo& self, bool peer_is_pred,
              const std::string& relay_url, const std::string& relay_secret) {
  json j = {{"window", peer.window},
            {"node", peer.node},
            {"claim", peer.id},
            {"address", peer.address},
            {"behind_nat", peer.behind_nat}};
  if ((peer.behind_nat || self.behind_nat) && !relay_url.empty()) {
    const std::string edge =
        peer_is_pred ? EdgeIdFor(peer.id, self.id) : EdgeIdFor(self.id, peer.id);
    // Across the edge to our predecessor we are its successor side, and the reverse.
    const relay::Role role =
        peer_is_pred ? relay::Role::kSuccessorSide : relay::Role::kPredecessorSide;
    j.update(EdgeJson(relay_url, relay_secret, edge, role));
  }
  return j;
}

}  // namespace

relay::EdgeToken EdgeTokenFor(const std::string& relay_secret, const std::string& edge,
                              relay::Role role) {
  if (relay_secret.empty()) return relay::EdgeToken{};
  return relay::MakeEdgeToken(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(relay_secret.data()),
                               relay_secret.size()),
      edge, role);
}

json EdgeJson(const std::string& relay_url, const std::string& relay_secret,
              const std::string& edge, relay::Role role) {
  const relay::EdgeToken token = EdgeTokenFor(relay_secret, edge, role);
  return {{"via", fmt::format("{}/edge/{}", relay_url, edge)},
          {"token",
           ToHex(std::string_view(reinterpret_cast<const char*>(token.data()), token.size()))}};
}

std::string CheckEdgeIdFor(int64_t standby_claim) { return fmt::format("c{}", standby_claim); }

std::string EdgeIdFor(int64_t pred_claim, int64_t next_claim) {
  return fmt::format("e{}-{}", pred_claim, next_claim);
}

std::string WindowStateName(const WindowState& w, int64_t epoch, double now, double lease_s) {
  if (!w.claim) return "uncovered";
  if (now - w.claim->last_beat > lease_s / 2) return "expiring";
  return w.claim->serving_epoch == epoch ? "serving" : "claimed";
}

json MapToJson(const std::vector<ModelState>& models, double now, double lease_s,
               const std::string& relay_url) {
  json out = {{"time", static_cast<int64_t>(now)}, {"lease_s", lease_s}, {"relay", relay_url}};
  json jm = json::array();
  for (const ModelState& m : models) {
    json rings = json::array();
    for (const RingState& r : m.rings) {
      json windows = json::array();
      for (const WindowState& w : r.windows) {
        json jw = {{"window", w.window},
                   {"first", w.first},
                   {"last", w.last},
                   {"bytes", w.bytes},
                   {"memory", w.memory},
                   {"rate", w.rate},
                   {"reward", std::round(w.rate * (w.last - w.first) * 1000) / 1000},
                   {"state", WindowStateName(w, r.epoch, now, lease_s)}};
        if (w.claim) {
          jw["holder"] = w.claim->node;
          jw["claim"] = w.claim->id;
          jw["expires_in"] = Seconds(w.claim->expires - now);
          jw["address"] = w.claim->address;
          jw["behind_nat"] = w.claim->behind_nat;
          // The market's check of the holder for this epoch (holders behind NAT are not dialed).
          if (w.claim->checked()) jw["checked"] = w.claim->verified_epoch == r.epoch;
          if (!w.claim->check_error.empty()) jw["check_error"] = w.claim->check_error;
          jw["proven"] = w.claim->proven;
        }
        json standbys = json::array();
        for (const ClaimInfo& c : w.standbys) {
          json js = {{"node", c.node},
                     {"claim", c.id},
                     {"expires_in", Seconds(c.expires - now)},
                     {"address", c.address},
                     {"behind_nat", c.behind_nat},
                     {"proven", c.proven},
                     {"ready", c.proven && c.serving_epoch == r.epoch},
                     // Its last check passed: it may be promoted.
                     {"checked", c.verified_at > 0 && c.check_error.empty()}};
          if (!c.check_error.empty()) js["check_error"] = c.check_error;
          standbys.push_back(std::move(js));
        }
        jw["standbys"] = std::move(standbys);
        windows.push_back(std::move(jw));
      }
      rings.push_back({{"ring", r.ring},
                       {"epoch", r.epoch},
                       {"complete", r.complete},
                       {"serving", r.serving},
                       {"ready", r.ready},
                       {"windows", std::move(windows)}});
    }
    jm.push_back({{"name", m.name},
                  {"model_id", m.model_id},
                  {"url", m.url},
                  {"n_layer", m.n_layer},
                  {"ctx", m.ctx},
                  {"max_rows_per_s", m.max_rows_per_s},
                  {"demand",
                   {{"total", m.demand_total},
                    {"recent", m.demand_recent},
                    {"requests", m.requests_recent},
                    {"sessions", m.sessions_recent}}},
                  {"rings", std::move(rings)}});
  }
  out["models"] = std::move(jm);
  return out;
}

json GrantToJson(const ClaimGrant& g, double now) {
  json tensors = json::array();
  for (const TensorDigest& t : g.window.tensors) {
    tensors.push_back({{"name", t.name}, {"sha256", t.sha256}});
  }
  return {{"claim", g.claim.id},
          {"lease_s", Seconds(g.claim.expires - g.claim.last_beat)},
          {"expires_in", Seconds(g.claim.expires - now)},
          {"rate", g.claim.rate},
          {"model", g.model.name},
          {"model_id", g.model.model_id},
          {"url", g.model.url},
          {"ring", g.claim.ring},
          {"window", g.claim.window},
          {"first", g.window.first},
          {"last", g.window.last},
          {"n_layer", g.model.n_layer},
          {"ctx", g.model.ctx},
          {"memory", g.window.memory},
          {"standby", g.claim.standby},
          {"tensors", std::move(tensors)}};
}

json HeartbeatToJson(const HeartbeatReply& reply, double now, const std::string& relay_url,
                     const std::string& relay_secret) {
  const RingState& r = reply.ring;
  json out = {{"expires_in", Seconds(reply.claim.expires - now)},
              {"epoch", r.epoch},
              {"complete", r.complete},
              {"ready", r.ready},
              {"pred", nullptr},
              {"next", nullptr}};
  const size_t n = r.windows.size();
  const auto w = static_cast<size_t>(reply.claim.window);
  if (r.complete && n >= 2 && w < n) {
    const ClaimInfo& pred = *r.windows[(w + n - 1) % n].claim;
    const ClaimInfo& next = *r.windows[(w + 1) % n].claim;
    out["pred"] = PeerJson(pred, reply.claim, true, relay_url, relay_secret);
    out["next"] = PeerJson(next, reply.claim, false, relay_url, relay_secret);
  }
  // Standbys (docs/MARKET.md, "Standbys"): this claim's role, and the standbys of the
  // neighbouring windows, which the predecessor dials and the successor accepts when a
  // neighbour dies.
  out["standby"] = reply.claim.standby;
  json pred_standbys = json::array(), next_standbys = json::array();
  if (n >= 2 && w < n) {
    for (const ClaimInfo& c : r.windows[(w + n - 1) % n].standbys) {
      pred_standbys.push_back(PeerJson(c, reply.claim, true, relay_url, relay_secret));
    }
    for (const ClaimInfo& c : r.windows[(w + 1) % n].standbys) {
      next_standbys.push_back(PeerJson(c, reply.claim, false, relay_url, relay_secret));
    }
  }
  out["pred_standbys"] = std::move(pred_standbys);
  out["next_standbys"] = std::move(next_standbys);
  if (reply.claim.standby > 0 && reply.claim.behind_nat && !relay_url.empty()) {
    // The edge the market checks this standby through, which its stage keeps dialed as the
    // successor side whatever its links (docs/MARKET.md, "Checked before promoted").
    out["check"] = EdgeJson(relay_url, relay_secret, CheckEdgeIdFor(reply.claim.id),
                            relay::Role::kSuccessorSide);
  }
  if (!reply.claim.proven) {
    json ranges = json::array();
    for (const ProofRange& p : reply.challenge) {
      ranges.push_back({{"tensor", p.tensor}, {"offset", p.offset}, {"length", p.length}});
    }
    out["challenge"] = {{"nonce", reply.challenge_nonce}, {"ranges", ranges}};
  }
  if (!reply.audits.empty()) out["audits"] = AuditRequestsToJson(reply.audits);
  return out;
}

json BalancesToJson(const std::vector<Balance>& balances,
                    const std::vector<ReceiptRecord>& receipts) {
  json jb = json::array();
  for (const Balance& b : balances) {
    jb.push_back({{"node", b.node},
                  {"credit", b.credit},
                  {"work", b.work},
                  {"receipts", b.receipts},
                  {"audits_passed", b.audits_passed},
                  {"audits_failed", b.audits_failed},
                  {"audits_disputed", b.audits_disputed}});
  }
  json jr = json::array();
  for (const ReceiptRecord& r : receipts) {
    json lines = json::array();
    for (const CreditLine& l : r.lines) {
      lines.push_back({{"node", l.node},
                       {"first", l.first},
                       {"last", l.last},
                       {"work", l.work},
                       {"credit", l.credit}});
    }
    jr.push_back({{"id", r.id},
                  {"model", r.model},
                  {"ring", r.ring},
                  {"tokens", r.tokens},
                  {"time", r.time},
                  {"lines", std::move(lines)}});
  }
  return {{"balances", std::move(jb)}, {"receipts", std::move(jr)}};
}

}  // namespace kvasir::market
