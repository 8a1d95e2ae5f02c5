// A heartbeat on PostgreSQL in two round trips (docs/MARKET.md, "The store"): each statement of
// the general path (claims.cpp, Store::HeartbeatOnce) is a round trip to the server, about fifteen
// a heartbeat. Here the transaction's reads go in one pipeline (Db::RunBatch): its BEGIN, the
// nonce, what the sweep would act on, the claim and its ring, the node's audits; its writes and
// its COMMIT in a second. The reads name the ring through the claim's id, so none waits for
// another's answer. The result is what the general path answers, as long as the sweep has nothing
// to do: when it has (a claim due, a standby to promote, the once-a-second scan for idle claims),
// or the market is silent, or the claim is gone, another node's or not proven, or an audit is
// open or overdue, the transaction is rolled back (its nonce with it) and the general path runs.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "market/store.h"
#include "market/store_rows.h"

namespace kvasir::market {
namespace {

// The new state of the claim after a heartbeat that writes it (claims.cpp's UPDATE).
void Renew(ClaimInfo* c, int64_t serving_epoch, double now, double lease_s) {
  c->expires = now + lease_s;
  c->last_beat = now;
  c->serving_since = serving_epoch < 0                   ? 0
                     : c->serving_epoch == serving_epoch ? c->serving_since
                                                         : now;
  c->serving_epoch = serving_epoch;
}

// Prepares `sql` into `*out` (a Stmt cannot be assigned).
Status PrepareInto(Db* db, std::optional<Stmt>* out, std::string_view sql) {
  KV_ASSIGN_OR_RETURN(Stmt s, db->Prepare(sql));
  out->emplace(std::move(s));
  return Status::Ok();
}

}  // namespace

Result<std::optional<HeartbeatReply>> Store::PipelinedHeartbeat(const std::string& node,
                                                                int64_t claim,
                                                                int64_t serving_epoch, double now,
                                                                double lease_s,
                                                                const RequestNonce* nonce) {
  using None = std::optional<HeartbeatReply>;
  // The scan for idle claims (every second) goes the general way, with its sweep.
  if (!(now >= evict_scan_at_ && now - evict_scan_at_ < 1)) return None();
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  // As the general path's: a lost renewal is covered by a restarted market's grace.
  KV_RETURN_IF_ERROR(db_->Exec("SET LOCAL synchronous_commit = off"));
  std::vector<Stmt*> batch;
  std::optional<Stmt> insert_nonce, delete_nonces;
  if (nonce != nullptr) {
    KV_RETURN_IF_ERROR(PrepareInto(db_.get(), &insert_nonce,
                                   "INSERT INTO nonces(node, nonce, expires) "
                                   "VALUES(?, ?, ?) ON CONFLICT DO NOTHING "
                                   "RETURNING 1"));
    insert_nonce->Bind(1, node).Bind(2, nonce->nonce).Bind(3, now + nonce->keep_s);
    batch.push_back(&*insert_nonce);
  }
  if (!(now >= nonce_sweep_at_ && now - nonce_sweep_at_ < 1)) {
    nonce_sweep_at_ = now;
    KV_RETURN_IF_ERROR(
        PrepareInto(db_.get(), &delete_nonces, "DELETE FROM nonces WHERE expires <= ?"));
    delete_nonces->Bind(1, now);
    batch.push_back(&*delete_nonces);
  }
  KV_ASSIGN_OR_RETURN(auto demand, db_->Prepare("DELETE FROM demand WHERE time < ?"));
  demand.Bind(1, now - kRecentSeconds);
  // One row: what would send this heartbeat the general way (the last heartbeat answered, for a
  // silence; the earliest end of a lease, for a claim due; a standby to promote; an audit overdue
  // or open for this node), and the claim's model and ring as ReadModels reads them. No row when
  // the claim is gone.
  KV_ASSIGN_OR_RETURN(
      auto state,
      db_->Prepare(fmt::format(
          "SELECT (SELECT value FROM meta WHERE key = ?2), (SELECT min(expires) FROM claims), "
          "EXISTS (SELECT 1 FROM claims s WHERE {}), EXISTS (SELECT 1 FROM audits WHERE state = "
          "'asked' AND (deadline < ?3 OR node = ?4)), m.model_id, m.n_windows, m.n_held, (SELECT "
          "count(*) FROM demand d WHERE d.model = m.id), (SELECT count(*) FROM receipts r WHERE "
          "r.model = m.name AND r.time > ?6), r.epoch FROM claims k JOIN models m ON m.id = "
          "k.model JOIN rings r ON r.model = k.model AND r.ring = k.ring WHERE k.id = ?5",
          kPromotable)));
  state.Bind(1, check_standbys_ ? 1 : 0)
      .Bind(2, std::string_view(kMetaLastBeat))
      .Bind(3, now)
      .Bind(4, node)
      .Bind(5, claim)
      .Bind(6, now - kRecentSeconds);
  // The ring's windows and claims (the claim's own among them).
  KV_ASSIGN_OR_RETURN(auto windows, db_->Prepare("SELECT w.window, w.first, w.last, w.bytes, "
                                                 "w.memory FROM windows w JOIN claims k ON "
                                                 "w.model = k.model AND w.ring = k.ring WHERE "
                                                 "k.id = ? ORDER BY w.window"));
  windows.Bind(1, claim);
  KV_ASSIGN_OR_RETURN(auto claims, db_->Prepare(fmt::format("SELECT {} FROM claims k JOIN claims "
                                                            "c ON c.model = k.model AND c.ring = "
                                                            "k.ring JOIN models m ON m.id = "
                                                            "c.model WHERE k.id = ? ORDER BY c.id",
                                                            kClaimColumns)));
  claims.Bind(1, claim);
  for (Stmt* s : {&demand, &state, &windows, &claims}) batch.push_back(s);
  KV_RETURN_IF_ERROR(db_->RunBatch(batch));

  if (insert_nonce) {
    // A heartbeat that fails is rolled back with its nonce: it changed nothing a replay could.
    KV_ASSIGN_OR_RETURN(const bool fresh, insert_nonce->Step());
    if (!fresh) {
      return Error(StatusCode::kUnauthenticated,
                   "X-Kvasir-Nonce: used before by node {}: a replayed request", Short(node));
    }
  }
  KV_ASSIGN_OR_RETURN(const bool has_claim, state.Step());
  if (!has_claim) return None();
  const double last_beat = state.IsNull(0) ? 0 : state.Real(0);
  silent_ = last_beat > 0 && now - last_beat > lease_s_ / 2;
  last_beat_ = last_beat;
  // Outside a silence the lease clock is `now`: a claim is due when its lease ended by then.
  const bool due = !state.IsNull(1) && state.Real(1) <= now;
  if (silent_ || due || state.Int(2) != 0 || state.Int(3) != 0) return None();
  HeartbeatReply reply;
  reply.model_id = state.Text(4);
  const int64_t total = state.Int(5), held = state.Int(6);
  const int64_t demand_recent = std::min(state.Int(7), state.Int(8));
  reply.ring.epoch = state.Int(9);
  while (true) {
    KV_ASSIGN_OR_RETURN(bool more, windows.Step());
    if (!more) break;
    WindowState w;
    w.window = static_cast<int>(windows.Int(0));
    w.first = static_cast<int>(windows.Int(1));
    w.last = static_cast<int>(windows.Int(2));
    w.bytes = static_cast<uint64_t>(windows.Int(3));
    w.memory = static_cast<uint64_t>(windows.Int(4));
    reply.ring.windows.push_back(std::move(w));
  }
  std::vector<ClaimInfo> rows;
  std::optional<ClaimInfo> row;  // the claim's own, as stored
  while (true) {
    KV_ASSIGN_OR_RETURN(bool more, claims.Step());
    if (!more) break;
    rows.push_back(ClaimFromRow(claims, 0));
    if (rows.back().id == claim) row = rows.back();
  }
  if (!row || row->node != node || !row->proven) return None();
  reply.ring.ring = row->ring;
  // A renewal that changes nothing but the lease waits in memory (lease_flush.cpp); anything
  // else is written now (below), and answered as written.
  const bool lease_only = lease_flush_s_ > 0 && row->serving_epoch == serving_epoch;
  for (ClaimInfo& c : rows) {
    if (c.id == claim && !lease_only) Renew(&c, serving_epoch, now, lease_s);
    Overlay(&c);
    const auto w = static_cast<size_t>(c.window);
    if (w >= reply.ring.windows.size()) continue;
    if (c.standby) {
      reply.ring.windows[w].standbys.push_back(std::move(c));
    } else {
      reply.ring.windows[w].claim = std::move(c);
    }
  }
  DeriveRing(&reply.ring,
             RewardRate(demand_recent, static_cast<int>(total - held), static_cast<int>(total)));
  reply.claim = *row;
  if (lease_only) {
    Overlay(&reply.claim);
    reply.claim.expires = std::max(reply.claim.expires, now + lease_s);
    reply.claim.last_beat = std::max(reply.claim.last_beat, now);
  } else {
    Renew(&reply.claim, serving_epoch, now, lease_s);
    Overlay(&reply.claim);
  }

  std::vector<Stmt*> writes;
  std::optional<Stmt> beat, update, forgive;
  // One row every heartbeat would write: at most once a second (as in the general path).
  if (now - last_beat_ >= 1 || now < last_beat_) {
    KV_RETURN_IF_ERROR(PrepareInto(db_.get(), &beat,
                                   "INSERT INTO meta(key, value) VALUES(?, ?) ON "
                                   "CONFLICT(key) DO UPDATE SET value = excluded.value"));
    beat->Bind(1, std::string_view(kMetaLastBeat)).Bind(2, now);
    writes.push_back(&*beat);
  }
  if (!lease_only) {
    KV_RETURN_IF_ERROR(PrepareInto(db_.get(), &update,
                                   "UPDATE claims SET expires = ?, last_beat = ?, "
                                   "serving_since = CASE WHEN CAST(?3 AS BIGINT) < 0 "
                                   "THEN 0 WHEN serving_epoch = ?3 THEN serving_since "
                                   "ELSE ?2 END, serving_epoch = ?3 WHERE id = ?4"));
    update->Bind(1, now + lease_s).Bind(2, now).Bind(3, serving_epoch).Bind(4, claim);
    writes.push_back(&*update);
  }
  if (reply.claim.serving_epoch == reply.ring.epoch) {
    // It serves: the evictions it had are forgiven.
    KV_RETURN_IF_ERROR(PrepareInto(db_.get(), &forgive, "DELETE FROM strikes WHERE node = ?"));
    forgive->Bind(1, node);
    writes.push_back(&*forgive);
  }
  KV_RETURN_IF_ERROR(txn->CommitAfter(std::move(writes)));
  if (lease_only) RecordRenewal(claim, node, now + lease_s, now, nullptr, {}, now);
  ++pipelined_heartbeats_;
  return None(std::move(reply));
}

}  // namespace kvasir::market
