// Renewals and replay stamps in memory (lease_table.h): when they are written, on which
// connection, and how what is answered and decided meanwhile sees them.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "market/store.h"
#include "market/store_rows.h"

namespace kvasir::market {
namespace {

// Never shortens what another process (or a claim's renewal) wrote meanwhile; a claim gone, or
// now another node's, is left alone. `stamped`: the claim's replay stamp too, unless the row's is
// of a later second (memory merged the row's into its own when it accepted the heartbeat).
Status WriteRenewal(Db* db, int64_t id, const PendingLease& p, bool stamped) {
  if (!stamped) {
    KV_ASSIGN_OR_RETURN(auto s, db->Prepare("UPDATE claims SET expires = CASE WHEN expires > ?1 "
                                            "THEN expires ELSE ?1 END, last_beat = CASE WHEN "
                                            "last_beat > ?2 THEN last_beat ELSE ?2 END WHERE id = "
                                            "?3 AND node = ?4"));
    return s.Bind(1, p.expires).Bind(2, p.last_beat).Bind(3, id).Bind(4, p.node).Run();
  }
  KV_ASSIGN_OR_RETURN(auto s, db->Prepare("UPDATE claims SET expires = CASE WHEN expires > ?1 "
                                          "THEN expires ELSE ?1 END, last_beat = CASE WHEN "
                                          "last_beat > ?2 THEN last_beat ELSE ?2 END, signed_at = "
                                          "CASE WHEN signed_at > ?5 THEN signed_at ELSE ?5 END, "
                                          "signed_nonces = CASE WHEN signed_at > ?5 THEN "
                                          "signed_nonces ELSE ?6 END WHERE id = ?3 AND node = ?4"));
  return s.Bind(1, p.expires)
      .Bind(2, p.last_beat)
      .Bind(3, id)
      .Bind(4, p.node)
      .Bind(5, p.stamp.time)
      .Bind(6, p.stamp.nonces)
      .Run();
}

}  // namespace

bool Store::LeaseFlushDue(double now) const {
  return !leases_.empty() && (now - flushed_at_ >= lease_flush_s_ || now < flushed_at_);
}

Status Store::FlushLeases(double now) {
  if (leases_.empty()) {
    flushed_at_ = now;
    return Status::Ok();
  }
  // A copy: the transaction may be tried again, and the table changes only once it committed.
  const PendingLeases pending = leases_.pending();
  KV_RETURN_IF_ERROR(Retry([&] { return FlushLeasesOnce(db_.get(), pending); }));
  leases_.Written(pending);
  flushed_at_ = now;
  return Status::Ok();
}

Status Store::FlushLeasesOnce(Db* db, const PendingLeases& pending) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db));
  if (db->postgres()) {
    // Each UPDATE only ever lengthens a lease and reads the row it writes as it is then, so the
    // flush needs no serializable snapshot; run serializable, a flush of hundreds of rows made
    // the other processes' heartbeats fail as its pivots. Not waiting for the disk, as a
    // heartbeat's own commit: a lost flush is covered by the grace of a restarted market.
    KV_RETURN_IF_ERROR(db->Exec("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"));
    KV_RETURN_IF_ERROR(db->Exec("SET LOCAL synchronous_commit = off"));
  }
  // In id order, so concurrent flushes of two processes lock rows in one order.
  std::vector<int64_t> ids;
  ids.reserve(pending.size());
  for (const auto& [id, p] : pending) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  const bool stamped = StampsInMemory();
  for (int64_t id : ids) KV_RETURN_IF_ERROR(WriteRenewal(db, id, pending.at(id), stamped));
  if (db == flush_db_.get() && flush_hook_) KV_RETURN_IF_ERROR(flush_hook_());
  return txn->Commit();
}

Result<bool> Store::EnableBackgroundFlush() {
  if (flush_db_ != nullptr) return true;
  const std::string& path = db_->path();
  if (db_->postgres() || path.empty() || path == ":memory:" || path.starts_with("file:")) {
    return false;
  }
  KV_ASSIGN_OR_RETURN(flush_db_, Db::Open(path));
  // The WAL is copied back into the file (a checkpoint, with its fsync) by the commit that finds
  // it past a size: left to the flush's connection (SQLite's default, 1,000 pages: about every
  // flush of thousands of renewals), off the lock requests are answered with; the Store's own
  // connection checkpoints only if the WAL grew 16 times that (no flush for a long while).
  KV_RETURN_IF_ERROR(db_->Exec("PRAGMA wal_autocheckpoint=16000"));
  return true;
}

std::shared_ptr<const PendingLeases> Store::TakeLeaseFlush(double now) {
  if (flush_db_ == nullptr || in_flight_ != nullptr || !LeaseFlushDue(now)) return nullptr;
  in_flight_ = std::make_shared<const PendingLeases>(leases_.Take());
  flushed_at_ = now;
  return in_flight_;
}

Status Store::WriteLeaseFlush(const PendingLeases& batch) {
  return FlushLeasesOnce(flush_db_.get(), batch);
}

void Store::EndLeaseFlush(const Status& written, double now) {
  if (in_flight_ == nullptr) return;
  if (!written.ok()) {
    leases_.Restore(*in_flight_);
    // Due again at once: counted from the oldest waiting.
    flushed_at_ = now - lease_flush_s_;
  }
  in_flight_.reset();
}

bool Store::InMemory(int64_t claim, const std::string& node, PendingLease* out) const {
  bool found = false;
  *out = PendingLease{node, 0, 0, {}};
  if (in_flight_ != nullptr) {
    auto it = in_flight_->find(claim);
    if (it != in_flight_->end() && it->second.node == node) {
      MergeLease(out, it->second);
      found = true;
    }
  }
  const PendingLease* p = leases_.Find(claim);
  if (p != nullptr && p->node == node) {
    MergeLease(out, *p);
    found = true;
  }
  return found;
}

void Store::Overlay(ClaimInfo* c) const {
  PendingLease p;
  if (!InMemory(c->id, c->node, &p)) return;
  c->expires = std::max(c->expires, p.expires);
  c->last_beat = std::max(c->last_beat, p.last_beat);
}

Result<BeatStamp> Store::StampOf(int64_t claim, const std::string& node) {
  BeatStamp stamp;
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT signed_at, signed_nonces FROM claims WHERE id "
                                           "= ? AND node = ?"));
  KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, claim).Bind(2, node).Step());
  if (row) {
    stamp.time = s.Int(0);
    stamp.nonces = s.Text(1);
  }
  PendingLease p;
  if (InMemory(claim, node, &p)) stamp.Merge(p.stamp);
  return stamp;
}

Status Store::CheckStamp(const BeatStamp& stamp, const RequestNonce& nonce,
                         const std::string& node) {
  if (!stamp.Refuses(nonce.time, nonce.nonce)) return Status::Ok();
  if (nonce.time < stamp.time) {
    return Error(StatusCode::kUnauthenticated,
                 "X-Kvasir-Time: {} is before the last heartbeat of node {} ({}): a replayed "
                 "request, or the node's clock stepped back",
                 nonce.time, Short(node), stamp.time);
  }
  if (stamp.Contains(nonce.nonce)) {
    return Error(StatusCode::kUnauthenticated,
                 "X-Kvasir-Nonce: used before by node {}: a replayed request", Short(node));
  }
  return Error(StatusCode::kUnauthenticated,
               "X-Kvasir-Time: node {} sent more than {} heartbeats signed in second {}",
               Short(node), BeatStamp::kMaxNonces, nonce.time);
}

void Store::RecordRenewal(int64_t claim, const std::string& node, double expires, double last_beat,
                          const RequestNonce* nonce, BeatStamp stamp, double now) {
  const bool stamped = nonce != nullptr && StampsInMemory();
  if (expires == 0 && !stamped) return;
  // The row's stamp is always one memory had: memory's, merged with it, holds every nonce of its
  // second, so a flush that writes it over the row's of the same second loses none.
  if (stamped) {
    stamp.Add(nonce->time, nonce->nonce);
  } else {
    stamp = {};
  }
  if (leases_.empty()) flushed_at_ = now;  // counted from the oldest waiting
  leases_.Renew(claim, node, expires, last_beat, stamp);
}

Status Store::WriteRenewalsDue(const char* due, double silence_start, double lease_clock,
                               double now) {
  if (leases_.empty() && in_flight_ == nullptr) return Status::Ok();
  std::vector<std::pair<int64_t, std::string>> due_ids;
  {
    KV_ASSIGN_OR_RETURN(auto s,
                        db_->Prepare(fmt::format("SELECT id, node FROM claims WHERE {}", due)));
    s.Bind(1, silence_start).Bind(2, lease_clock).Bind(3, now);
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      due_ids.emplace_back(s.Int(0), s.Text(1));
    }
  }
  const bool stamped = StampsInMemory();
  for (const auto& [id, node] : due_ids) {
    PendingLease p;
    if (InMemory(id, node, &p)) KV_RETURN_IF_ERROR(WriteRenewal(db_.get(), id, p, stamped));
  }
  return Status::Ok();
}

}  // namespace kvasir::market
