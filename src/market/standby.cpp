// The standby half of the Store (docs/MARKET.md, "Standbys"): a node that stands by for a held
// window has a claim of its own with a standby number above 0 (a lease, a challenge to prove its
// bytes, the same deadlines as any claim), and the oldest proven standby of a window whose claim
// is gone becomes that window's claim, keeping its id, before any new claimer can take it.
#include <fmt/format.h>
#include <sodium.h>

#include <set>
#include <tuple>

#include "market/signed_request.h"
#include "market/store.h"
#include "market/store_rows.h"

namespace kvasir::market {

Result<std::pair<int64_t, bool>> Store::StandBy(const ClaimRequest& req, int64_t model_row,
                                                const WindowState& w, size_t n_samples, double now,
                                                double lease_s) {
  for (const ClaimInfo& c : w.standbys) {
    if (c.node != req.node) continue;
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE claims SET expires = ?, last_beat = ?, "
                                             "address = ? WHERE id = ?"));
    KV_RETURN_IF_ERROR(
        s.Bind(1, now + lease_s).Bind(2, now).Bind(3, req.address).Bind(4, c.id).Run());
    return std::pair<int64_t, bool>(c.id, true);
  }
  std::string nonce(kProofNonceBytes, '\0');
  randombytes_buf(nonce.data(), nonce.size());
  std::string picks;
  for (int i = 0; n_samples > 0 && i < kRangesPerChallenge; ++i) {
    if (!picks.empty()) picks += ',';
    picks += std::to_string(randombytes_uniform(static_cast<uint32_t>(n_samples)));
  }
  KV_ASSIGN_OR_RETURN(
      auto s, db_->Prepare("INSERT INTO claims(model, ring, window, node, address, behind_nat, "
                           "rate, created, expires, last_beat, proven, proof_nonce, proof_picks, "
                           "standby) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
                           "?13, (SELECT COALESCE(MAX(standby), 0) + 1 FROM claims WHERE model = "
                           "?1 AND ring = ?2 AND window = ?3)) RETURNING id"));
  s.Bind(1, model_row)
      .Bind(2, req.ring)
      .Bind(3, req.window)
      .Bind(4, req.node)
      .Bind(5, req.address)
      .Bind(6, req.behind_nat ? 1 : 0)
      .Bind(7, w.rate)
      .Bind(8, now)
      .Bind(9, now + lease_s)
      .Bind(10, now)
      .Bind(11, n_samples == 0 ? 1 : 0)
      .Bind(12, ToHex(nonce))
      .Bind(13, picks);
  auto inserted = s.Step();
  if (!inserted.ok() || !*inserted) {
    const Status st = inserted.ok() ? Error("no id returned") : inserted.status();
    return Error(StatusCode::kConflict, "standby for window {} of ring {} of '{}': {}", req.window,
                 req.ring, req.model, st.message());
  }
  const int64_t id = s.Int(0);
  KV_RETURN_IF_ERROR(s.Run());  // SQLite commits no statement left halfway
  return std::pair<int64_t, bool>(id, false);
}

Status Store::PromoteStandbys(double now) {
  std::vector<std::tuple<int64_t, int64_t, int>> promote;  // claim, model row, ring
  {
    KV_ASSIGN_OR_RETURN(
        auto s, db_->Prepare("SELECT s.id, s.model, s.ring, s.window FROM claims s WHERE "
                             "s.standby > 0 AND s.proven = 1 AND NOT EXISTS (SELECT 1 FROM "
                             "claims c WHERE c.model = s.model AND c.ring = s.ring AND c.window = "
                             "s.window AND c.standby = 0) ORDER BY s.standby, s.id"));
    std::set<std::tuple<int64_t, int64_t, int64_t>> taken;  // model, ring, window
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      if (!taken.insert({s.Int(1), s.Int(2), s.Int(3)}).second) continue;
      promote.emplace_back(s.Int(0), s.Int(1), static_cast<int>(s.Int(2)));
    }
  }
  for (const auto& [claim, model, ring] : promote) {
    // It becomes the window's claim as of now: the ring's deadline to serve counts from here.
    KV_ASSIGN_OR_RETURN(auto u, db_->Prepare("UPDATE claims SET standby = 0, created = ?, "
                                             "serving_since = 0, verified_epoch = -1 WHERE id = "
                                             "?"));
    KV_RETURN_IF_ERROR(u.Bind(1, now).Bind(2, claim).Run());
    KV_RETURN_IF_ERROR(BumpEpoch(model, ring));
  }
  return Status::Ok();
}

}  // namespace kvasir::market
