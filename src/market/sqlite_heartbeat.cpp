// A heartbeat on SQLite in a read-only transaction (docs/MARKET.md, "The flush"). With renewals in
// memory, the common heartbeat (a lease-only renewal of a proven claim) writes nothing: its
// renewal and replay stamp wait in memory for the flush. Its transaction only reads, so on WAL it
// neither takes nor waits for the database's write lock, which a flush on its own connection
// (Store::WriteLeaseFlush) holds while it writes. The answer is what the general path
// (claims.cpp, Store::HeartbeatOnce) answers, as long as that path would write nothing either:
// when it would (a claim due without a renewal in memory, a standby to promote, an audit open or
// overdue, strikes to forgive, a silence, a nonce to record, another serving epoch, a proof, or
// the once-a-second housekeeping while no flush is being written), nullopt sends the heartbeat
// the general way.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "market/store.h"
#include "market/store_rows.h"

namespace kvasir::market {

Result<std::optional<HeartbeatReply>> Store::ReadOnlyHeartbeat(const std::string& node,
                                                               int64_t claim, int64_t serving_epoch,
                                                               double now, double lease_s,
                                                               const ProofAnswer* proof,
                                                               const RequestNonce* nonce) {
  using None = std::optional<HeartbeatReply>;
  if (proof != nullptr || (nonce != nullptr && !StampsInMemory())) return None();
  // The once-a-second work of the general path's sweep (the scan for idle claims, expired nonces,
  // the last heartbeat answered) goes the general way, unless a flush holds the write lock: it
  // then waits for a heartbeat after the flush.
  const bool housekeeping = !(now >= evict_scan_at_ && now - evict_scan_at_ < 1) ||
                            !(now >= nonce_sweep_at_ && now - nonce_sweep_at_ < 1) ||
                            now - last_beat_ >= 1 || now < last_beat_;
  const bool may_defer = in_flight_ != nullptr;
  if (housekeeping && !may_defer) return None();
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::BeginRead(db_.get()));
  {
    // What would make the general path write: a silence (the last heartbeat answered), a standby
    // to promote, an audit overdue or open for this node, expired demand (deferred as the
    // housekeeping), the node's strikes (forgiven once it serves).
    KV_ASSIGN_OR_RETURN(
        auto s, db_->Prepare(fmt::format(
                    "SELECT (SELECT value FROM meta WHERE key = ?2), EXISTS (SELECT 1 FROM claims "
                    "s WHERE {}), EXISTS (SELECT 1 FROM audits WHERE state = 'asked' AND "
                    "(deadline < ?3 OR node = ?4)), EXISTS (SELECT 1 FROM demand WHERE time < "
                    "?5), EXISTS (SELECT 1 FROM strikes WHERE node = ?4)",
                    kPromotable)));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, check_standbys_ ? 1 : 0)
                                      .Bind(2, std::string_view(kMetaLastBeat))
                                      .Bind(3, now)
                                      .Bind(4, node)
                                      .Bind(5, now - kRecentSeconds)
                                      .Step());
    if (!row) return None();
    const double last_beat = s.IsNull(0) ? 0 : s.Real(0);
    silent_ = last_beat > 0 && now - last_beat > lease_s_ / 2;
    last_beat_ = last_beat;
    if (silent_ || s.Int(1) != 0 || s.Int(2) != 0) return None();
    if (s.Int(3) != 0 && !may_defer) return None();
    if (s.Int(4) != 0) return None();
  }
  {
    // Outside a silence the lease clock is `now`: a claim is due when its lease ended by then. One
    // renewed in memory is written by the general path's sweep or the flush, and lapses not.
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT id, node FROM claims WHERE expires <= ?"));
    s.Bind(1, now);
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      PendingLease p;
      if (!InMemory(s.Int(0), s.Text(1), &p) || p.expires <= now) return None();
    }
  }
  auto c = ReadClaim(claim);
  if (!c.ok() || c->node != node || !c->proven || c->serving_epoch != serving_epoch) {
    return None();  // the general path answers what is wrong
  }
  BeatStamp stamp;
  if (nonce != nullptr) {
    KV_ASSIGN_OR_RETURN(stamp, StampOf(claim, node));
    KV_RETURN_IF_ERROR(CheckStamp(stamp, *nonce, node));
  }
  // The claim's ring, as the general path reads it (ring_cache.cpp).
  const uint64_t mark = db_->ChangeMark();
  std::vector<ModelState> models, fresh;
  const bool cached = RingFromCache(c->model, c->ring, mark, now, &models);
  if (!cached) {
    KV_ASSIGN_OR_RETURN(fresh, ReadModels(now, c->model, c->ring, /*overlay=*/false));
    models = fresh;
    OverlayAll(&models);
  }
  if (models.empty() || static_cast<size_t>(c->ring) >= models[0].rings.size()) return None();
  HeartbeatReply reply;
  reply.ring = models[0].rings[static_cast<size_t>(c->ring)];
  reply.model_id = models[0].model_id;
  reply.claim = *c;
  reply.claim.expires = std::max(reply.claim.expires, now + lease_s);
  reply.claim.last_beat = std::max(reply.claim.last_beat, now);
  KV_RETURN_IF_ERROR(txn->Commit());
  if (!cached && mark != 0 && db_->ChangeMark() == mark) {
    CacheRing(c->model, c->ring, mark, now, std::move(fresh));
  }
  RecordRenewal(claim, node, now + lease_s, now, nonce, std::move(stamp), now);
  ++read_only_heartbeats_;
  return None(std::move(reply));
}

}  // namespace kvasir::market
