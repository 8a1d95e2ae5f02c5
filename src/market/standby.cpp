// The standby half of the Store (docs/MARKET.md, "Standbys"): a node that stands by for a held
// window has a claim of its own with a standby number above 0 (a lease, a challenge to prove its
// bytes, the same deadlines as any claim), and the oldest proven standby of a window whose claim
// is gone becomes that window's claim, keeping its id, before any new claimer can take it; with a
// checker, only one the market dialed and found answering with its key.

#include <fmt/format.h>

#include <set>
#include <tuple>

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
  if (w.standbys.size() >= kMaxStandbysPerWindow) {
    return Error(StatusCode::kConflict,
                 "window {} of ring {} of '{}' has {} standbys already, the most a window has",
                 req.window, req.ring, req.model, w.standbys.size());
  }
  auto inserted = InsertClaim(req, model_row, w.rate, n_samples, now, lease_s);
  if (!inserted.ok()) {
    if (db_->retryable()) return inserted.status();  // run again (ClaimOnce)
    return Error(StatusCode::kConflict, "standby for window {} of ring {} of '{}': {}", req.window,
                 req.ring, req.model, inserted.status().message());
  }
  const int64_t id = *inserted;
  return std::pair<int64_t, bool>(id, false);
}

Status Store::PromoteStandbys(double now) {
  std::vector<std::tuple<int64_t, int64_t, int>> promote;  // claim, model row, ring
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare(fmt::format("SELECT s.id, s.model, s.ring, s.window "
                                                         "FROM claims s WHERE {} ORDER BY "
                                                         "s.standby, s.id",
                                                         kPromotable)));
    s.Bind(1, check_standbys_ ? 1 : 0);
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
