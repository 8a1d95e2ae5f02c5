// Renewals and heartbeat nonces in memory (lease_table.h, nonce_table.h): when they are written,
// and how what is answered and decided meanwhile sees them.
#include <fmt/format.h>

#include <algorithm>
#include <tuple>
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
    round_ = {};
    return Status::Ok();
  }
  // A copy: the transaction may be tried again, and the table changes only once it committed.
  const std::unordered_map<int64_t, PendingLease> pending = leases_.pending();
  const size_t n_nonces = nonces_.size();
  const std::vector<size_t> order = NonceOrder();
  uint64_t before = 0, after = 0;
  KV_RETURN_IF_ERROR(Retry([&] { return FlushLeasesOnce(pending, order, &before, &after); }));
  leases_.Written(pending);
  nonces_.Written(n_nonces);
  PatchRingCache(pending, before, after);
  flushed_at_ = now;
  round_ = {};  // all of it is written
  return Status::Ok();
}

Result<size_t> Store::FlushLeaseSlice(double now, size_t max_rows, double start_after_s) {
  max_rows = std::max<size_t>(1, max_rows);
  if (!round_.open) {
    if ((leases_.empty() && nonces_.empty()) ||
        (now - flushed_at_ < start_after_s && now >= flushed_at_)) {
      return size_t{0};
    }
    round_.open = true;
    round_.started = now;
    round_.ids.clear();
    round_.ids.reserve(leases_.size());
    for (const auto& [id, p] : leases_.pending()) round_.ids.push_back(id);
    std::sort(round_.ids.begin(), round_.ids.end());
    round_.next = 0;
    round_.nonces = NonceOrder();
    round_.nonce_next = 0;
  }
  // The round's renewals as they are now (a claim renewed again since gives its later lease; one
  // released since, nothing).
  std::unordered_map<int64_t, PendingLease> slice;
  size_t next = round_.next;
  for (; next < round_.ids.size() && slice.size() < max_rows; ++next) {
    if (const PendingLease* p = leases_.Find(round_.ids[next])) slice.emplace(round_.ids[next], *p);
  }
  const size_t nonce_end =
      std::min(round_.nonces.size(), round_.nonce_next + (max_rows - slice.size()));
  const std::vector<size_t> nonces(
      round_.nonces.begin() + static_cast<ptrdiff_t>(round_.nonce_next),
      round_.nonces.begin() + static_cast<ptrdiff_t>(nonce_end));
  if (!slice.empty() || !nonces.empty()) {
    uint64_t before = 0, after = 0;
    KV_RETURN_IF_ERROR(Retry([&] { return FlushLeasesOnce(slice, nonces, &before, &after); }));
    leases_.Written(slice);
    PatchRingCache(slice, before, after);
  }
  round_.next = next;
  round_.nonce_next = nonce_end;
  const size_t left = round_.ids.size() - round_.next + round_.nonces.size() - round_.nonce_next;
  if (left == 0) {
    // The round's nonces stay in memory until all are written (they are the first of nonces_,
    // written out of order); what was renewed or recorded since the round began waits from then
    // at the most.
    nonces_.Written(round_.nonces.size());
    flushed_at_ = round_.started;
    round_ = {};
  }
  return left;
}

void Store::PatchRingCache(const std::unordered_map<int64_t, PendingLease>& written,
                           uint64_t before, uint64_t after) {
  if (before == 0 || before != ring_cache_mark_) return;  // the next read finds them stale
  auto patch = [&](ClaimInfo* c) {
    auto it = written.find(c->id);
    if (it == written.end() || it->second.node != c->node) return;  // as WriteRenewal
    c->expires = std::max(c->expires, it->second.expires);
    c->last_beat = std::max(c->last_beat, it->second.last_beat);
  };
  for (auto& [key, cached] : ring_cache_) {
    for (RingState& r : cached.state.rings) {
      for (WindowState& w : r.windows) {
        if (w.claim) patch(&*w.claim);
        for (ClaimInfo& s : w.standbys) patch(&s);
      }
    }
  }
  ring_cache_mark_ = after;
}

std::vector<size_t> Store::NonceOrder() const {
  std::vector<size_t> order(nonces_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const std::vector<PendingNonce>& n = nonces_.pending();
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(n[a].node, n[a].nonce) < std::tie(n[b].node, n[b].nonce);
  });
  return order;
}

Result<bool> Store::NonceSeen(const std::string& node, const std::string& nonce) {
  if (nonces_.Contains(node, nonce)) return true;
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT 1 FROM nonces WHERE node = ? AND nonce = ?"));
  return s.Bind(1, node).Bind(2, nonce).Step();
}

Status Store::FlushLeasesOnce(const std::unordered_map<int64_t, PendingLease>& pending,
                              const std::vector<size_t>& nonces, uint64_t* before,
                              uint64_t* after) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  // Both in the transaction: no other connection commits between them (the write lock is held),
  // so from `before` to `after` is this flush and nothing else.
  *before = db_->ChangeMark();
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
  for (size_t i : nonces) {
    const PendingNonce& n = nonces_.pending()[i];
    KV_RETURN_IF_ERROR(InsertNonce(n.node, n.nonce, n.expires, 0).status());
  }
  *after = db_->ChangeMark();
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
