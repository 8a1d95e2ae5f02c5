// Renewals and heartbeat nonces in memory (lease_table.h, nonce_table.h): when they are written,
// and how what is answered and decided meanwhile sees them.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "market/store.h"

namespace kvasir::market {
namespace {

// Never shortens what another process (or a claim's renewal) wrote meanwhile; a claim gone, or
// now another node's, is left alone.
Status WriteRenewal(Db* db, int64_t id, const PendingLease& p) {
  KV_ASSIGN_OR_RETURN(auto s, db->Prepare("UPDATE claims SET expires = CASE WHEN expires > ?1 "
                                          "THEN expires ELSE ?1 END, last_beat = CASE WHEN "
                                          "last_beat > ?2 THEN last_beat ELSE ?2 END WHERE id = "
                                          "?3 AND node = ?4"));
  return s.Bind(1, p.expires).Bind(2, p.last_beat).Bind(3, id).Bind(4, p.node).Run();
}

}  // namespace

bool Store::LeaseFlushDue(double now) const {
  return !(leases_.empty() && nonces_.empty()) &&
         (now - flushed_at_ >= lease_flush_s_ || now < flushed_at_);
}

Status Store::FlushLeases(double now) {
  if (leases_.empty() && nonces_.empty()) {
    flushed_at_ = now;
    return Status::Ok();
  }
  // A copy: the transaction may be tried again, and the table changes only once it committed.
  const std::unordered_map<int64_t, PendingLease> pending = leases_.pending();
  const size_t n_nonces = nonces_.size();
  KV_RETURN_IF_ERROR(Retry([&] { return FlushLeasesOnce(pending, n_nonces); }));
  leases_.Written(pending);
  nonces_.Written(n_nonces);
  flushed_at_ = now;
  return Status::Ok();
}

Result<bool> Store::NonceSeen(const std::string& node, const std::string& nonce) {
  if (nonces_.Contains(node, nonce)) return true;
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT 1 FROM nonces WHERE node = ? AND nonce = ?"));
  return s.Bind(1, node).Bind(2, nonce).Step();
}

Status Store::FlushLeasesOnce(const std::unordered_map<int64_t, PendingLease>& pending,
                              size_t n_nonces) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  if (db_->postgres()) {
    // Each UPDATE only ever lengthens a lease and reads the row it writes as it is then, so the
    // flush needs no serializable snapshot; run serializable, a flush of hundreds of rows made
    // the other processes' heartbeats fail as its pivots. Not waiting for the disk, as a
    // heartbeat's own commit: a lost flush is covered by the grace of a restarted market.
    KV_RETURN_IF_ERROR(db_->Exec("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"));
    KV_RETURN_IF_ERROR(db_->Exec("SET LOCAL synchronous_commit = off"));
  }
  // In id order, so concurrent flushes of two processes lock rows in one order.
  std::vector<int64_t> ids;
  ids.reserve(pending.size());
  for (const auto& [id, p] : pending) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (int64_t id : ids) KV_RETURN_IF_ERROR(WriteRenewal(db_.get(), id, pending.at(id)));
  for (size_t i = 0; i < n_nonces; ++i) {
    const PendingNonce& n = nonces_.pending()[i];
    KV_RETURN_IF_ERROR(InsertNonce(n.node, n.nonce, n.expires, 0).status());
  }
  return txn->Commit();
}

void Store::Overlay(ClaimInfo* c) const {
  const PendingLease* p = leases_.Find(c->id);
  if (p == nullptr || p->node != c->node) return;
  c->expires = std::max(c->expires, p->expires);
  c->last_beat = std::max(c->last_beat, p->last_beat);
}

Status Store::WriteRenewalsDue(const char* due, double silence_start, double lease_clock,
                               double now) {
  if (leases_.empty()) return Status::Ok();
  std::vector<int64_t> renewed;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare(fmt::format("SELECT id FROM claims WHERE {}", due)));
    s.Bind(1, silence_start).Bind(2, lease_clock).Bind(3, now);
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      if (leases_.Find(s.Int(0)) != nullptr) renewed.push_back(s.Int(0));
    }
  }
  if (renewed.empty()) return Status::Ok();
  for (int64_t id : renewed) KV_RETURN_IF_ERROR(WriteRenewal(db_.get(), id, *leases_.Find(id)));
  return Status::Ok();
}

}  // namespace kvasir::market
