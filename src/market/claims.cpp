// The lease half of the Store: claiming, heartbeats (with the grace after a silence), releasing,
// and the outcomes of the market's checks of holders (docs/MARKET.md, "POST /v1/claims",
// "POST /v1/heartbeat", "Grace", "Ready rings are checked").
#include <fmt/format.h>
#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "market/signed_request.h"
#include "market/store.h"
#include "market/store_rows.h"

namespace kvasir::market {

Result<ClaimInfo> Store::ReadClaim(int64_t claim) {
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare(fmt::format("SELECT {} FROM claims c JOIN models m ON "
                                                       "m.id = c.model WHERE c.id = ?",
                                                       kClaimColumns)));
  KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, claim).Step());
  if (!row) {
    return Error(StatusCode::kNotFound, "claim {} is gone (its lease expired or it was released)",
                 claim);
  }
  ClaimInfo c = ClaimFromRow(s, 0);
  Overlay(&c);
  return c;
}

Result<ClaimGrant> Store::ClaimOnce(const ClaimRequest& req, double now, double lease_s) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT count, until FROM strikes WHERE node = ? AND "
                                             "until > ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, req.node).Bind(2, now).Step());
    if (row) {
      // Committed: the sweep above may have evicted someone.
      const int64_t count = s.Int(0);
      const double wait = s.Real(1) - now;
      KV_RETURN_IF_ERROR(txn->Commit());
      return Error(StatusCode::kForbidden,
                   "node {} was evicted {} time(s) for not serving its claims: it may claim "
                   "again in {:.0f} s",
                   Short(req.node), count, std::ceil(wait));
    }
  }
  {
    KV_ASSIGN_OR_RETURN(std::optional<std::string> banned, AuditBan(req.node, now));
    if (banned.has_value()) {
      KV_RETURN_IF_ERROR(txn->Commit());
      return Error(StatusCode::kForbidden, "{}", *banned);
    }
  }
  // Only the ring claimed: a claim costs the same however many windows its model has.
  KV_ASSIGN_OR_RETURN(auto models, ReadModels(now, req.model, std::max(0, req.ring)));
  if (models.empty()) return Error(StatusCode::kNotFound, "no model named '{}'", req.model);
  ModelState& m = models[0];
  if (req.ring < 0 || static_cast<size_t>(req.ring) >= m.rings.size()) {
    return Error(StatusCode::kNotFound, "model '{}' has rings 0 to {}, not {}", req.model,
                 m.rings.size() - 1, req.ring);
  }
  RingState& ring = m.rings[static_cast<size_t>(req.ring)];
  if (req.window < 0 || static_cast<size_t>(req.window) >= ring.windows.size()) {
    return Error(StatusCode::kNotFound, "ring {} of '{}' has windows 0 to {}, not {}", req.ring,
                 req.model, ring.windows.size() - 1, req.window);
  }
  if (req.window == 0 && req.behind_nat) {
    return Error("window 0 is the head, which clients dial: it needs an address, not behind_nat");
  }
  const WindowState& w = ring.windows[static_cast<size_t>(req.window)];
  ClaimGrant grant;
  if (req.standby && req.window == 0) {
    return Error("window 0 is the head, which clients dial: it has no standbys");
  }
  if (req.standby && !w.claim) {
    return Error(StatusCode::kConflict,
                 "window {} of ring {} of '{}' is uncovered: claim it rather than stand by for it",
                 req.window, req.ring, req.model);
  }
  auto own_standby = [&](int64_t id) {
    for (const ClaimInfo& c : w.standbys) {
      if (c.id == id) return true;
    }
    return false;
  };
  if (!req.standby && w.claim && w.claim->node != req.node) {
    return Error(StatusCode::kConflict,
                 "window {} of ring {} of '{}' is held by node {} (lease ends in {:.0f} s)",
                 req.window, req.ring, req.model, Short(w.claim->node),
                 std::max(0.0, w.claim->expires - now));
  }
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT c.id, m.name, c.ring, c.window FROM claims c "
                                             "JOIN models m ON m.id = c.model WHERE c.node = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, req.node).Step());
    const bool renews =
        row && (req.standby ? own_standby(s.Int(0)) : (w.claim && w.claim->id == s.Int(0)));
    if (row && !renews) {
      return Error(StatusCode::kConflict,
                   "node {} already holds claim {} (window {} of ring {} of '{}'); release it "
                   "first",
                   Short(req.node), s.Int(0), s.Int(3), s.Int(2), s.Text(1));
    }
  }
  KV_ASSIGN_OR_RETURN(const int64_t model_row, ModelRow(req.model));
  {
    KV_ASSIGN_OR_RETURN(auto s,
                        db_->Prepare("SELECT tensors, samples FROM windows WHERE model = ? AND "
                                     "ring = ? AND window = ?"));
    KV_ASSIGN_OR_RETURN(bool row,
                        s.Bind(1, model_row).Bind(2, req.ring).Bind(3, req.window).Step());
    if (!row) return Error("{}: window row missing", db_->path());
    const auto tensors = nlohmann::json::parse(s.Text(0), nullptr, false);
    if (tensors.is_discarded() || !tensors.is_array()) {
      return Error("{}: window {} of '{}': tensor list is not valid JSON", db_->path(), req.window,
                   req.model);
    }
    for (const auto& t : tensors) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() ||
          !t.contains("sha256") || !t["sha256"].is_string()) {
        return Error("{}: window {} of '{}': bad tensor entry", db_->path(), req.window, req.model);
      }
      grant.window.tensors.push_back(
          {t["name"].get<std::string>(), t["sha256"].get<std::string>()});
    }
    KV_ASSIGN_OR_RETURN(grant.window.samples, SamplesFromJson(s.Text(1)));
  }
  int64_t claim_id = 0;
  if (req.standby) {
    KV_ASSIGN_OR_RETURN(auto made,
                        StandBy(req, model_row, w, grant.window.samples.size(), now, lease_s));
    claim_id = made.first;
    grant.renewed = made.second;
    grant.window.samples.clear();  // the market's secret: never sent
  } else if (w.claim) {
    grant.renewed = true;
    claim_id = w.claim->id;
    // A new address must be checked again before the ring counts as ready.
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE claims SET expires = ?, last_beat = ?, "
                                             "verified_epoch = CASE WHEN address = ? THEN "
                                             "verified_epoch ELSE -1 END, address = ? WHERE id = "
                                             "?"));
    KV_RETURN_IF_ERROR(s.Bind(1, now + lease_s)
                           .Bind(2, now)
                           .Bind(3, req.address)
                           .Bind(4, req.address)
                           .Bind(5, claim_id)
                           .Run());
  } else {
    auto inserted = InsertClaim(req, model_row, w.rate, grant.window.samples.size(), now, lease_s);
    grant.window.samples.clear();  // the market's secret: never sent
    if (!inserted.ok()) {
      // Another process took the window (or this node another one) between our read and our
      // write: run again (Store::Retry), the read then names the holder. Never a 409 on a guess:
      // out of attempts, the failure stays what it was (503).
      if (db_->retryable()) return inserted.status();
      return Error(StatusCode::kConflict, "window {} of ring {} of '{}' was just taken: {}",
                   req.window, req.ring, req.model, inserted.status().message());
    }
    claim_id = *inserted;
    KV_RETURN_IF_ERROR(BumpEpoch(model_row, req.ring));
  }
  KV_ASSIGN_OR_RETURN(grant.claim, ReadClaim(claim_id));
  KV_RETURN_IF_ERROR(txn->Commit());
  grant.window.first = w.first;
  grant.window.last = w.last;
  grant.window.bytes = w.bytes;
  grant.window.memory = w.memory;
  grant.model = m;
  grant.model.rings.clear();
  return grant;
}

Result<HeartbeatReply> Store::HeartbeatOnce(const std::string& node, int64_t claim,
                                            int64_t serving_epoch, double now, double lease_s,
                                            const ProofAnswer* proof, const RequestNonce* nonce) {
  if (db_->postgres()) {
    KV_ASSIGN_OR_RETURN(auto quick,
                        PipelinedHeartbeat(node, claim, serving_epoch, now, lease_s, nonce));
    if (quick.has_value()) return *std::move(quick);
  } else if (lease_flush_s_ > 0) {
    KV_ASSIGN_OR_RETURN(auto quick,
                        ReadOnlyHeartbeat(node, claim, serving_epoch, now, lease_s, proof, nonce));
    if (quick.has_value()) return *std::move(quick);
  }
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  // A renewal need not wait for its own flush to disk (SQLite's WAL is synced at checkpoints
  // anyway): a database server that loses its last commits loses renewals, which the grace of a
  // restarted market covers (docs/MARKET.md, "Grace").
  if (db_->postgres()) KV_RETURN_IF_ERROR(db_->Exec("SET LOCAL synchronous_commit = off"));
  // A heartbeat that fails is rolled back with its nonce: it changed nothing a replay could. Its
  // stamp (StampsInMemory) is recorded only once the heartbeat committed.
  const bool stamped = nonce != nullptr && StampsInMemory();
  if (nonce != nullptr && !stamped) {
    KV_ASSIGN_OR_RETURN(const bool fresh, InsertNonce(node, nonce->nonce, now, nonce->keep_s));
    if (!fresh) {
      return Error(StatusCode::kUnauthenticated,
                   "X-Kvasir-Nonce: used before by node {}: a replayed request", Short(node));
    }
  }
  KV_RETURN_IF_ERROR(Sweep(now));
  KV_ASSIGN_OR_RETURN(ClaimInfo c, ReadClaim(claim));
  if (c.node != node) {
    return Error(StatusCode::kForbidden, "claim {} belongs to node {}, not {}", claim,
                 Short(c.node), Short(node));
  }
  BeatStamp stamp;
  if (stamped) {
    KV_ASSIGN_OR_RETURN(stamp, StampOf(claim, node));
    KV_RETURN_IF_ERROR(CheckStamp(stamp, *nonce, node));
  }
  if (proof != nullptr && !c.proven) {
    if (Status st = CheckProof(c, *proof); !st.ok()) {
      if (st.code() != StatusCode::kForbidden) return st;
      // Wrong bytes: the claim is evicted, and that is kept.
      KV_ASSIGN_OR_RETURN(const int64_t model_row, ModelRow(c.model));
      KV_RETURN_IF_ERROR(Evict(c.id, model_row, c.ring, c.node, now));
      KV_RETURN_IF_ERROR(txn->Commit());
      return Error(StatusCode::kForbidden, "{}; the claim is evicted", st.message());
    }
  }
  if (silent_) {
    // The market answers again after a silence: the nodes that kept trying must not lose their
    // claims for it, so every claim the silence kept gets a full lease from now.
    KV_ASSIGN_OR_RETURN(auto g, db_->Prepare("UPDATE claims SET expires = CASE WHEN expires > ?1 "
                                             "THEN expires ELSE ?1 END"));
    KV_RETURN_IF_ERROR(g.Bind(1, now + lease_s_).Run());
    KV_RETURN_IF_ERROR(SetMeta(kMetaSilenceEnd, now));
  }
  // One row every heartbeat would write: written at most once a second (what a silence of half
  // a lease needs), so concurrent heartbeats do not all conflict on it.
  if (silent_ || now - last_beat_ >= 1 || now < last_beat_) {
    KV_RETURN_IF_ERROR(SetMeta(kMetaLastBeat, now));
    last_beat_ = now;  // so the next heartbeat sees it written (sqlite_heartbeat.cpp)
  }
  // A renewal that changes nothing but the lease waits in memory for the next flush
  // (lease_flush.cpp); anything else is written now.
  const bool lease_only = lease_flush_s_ > 0 && !silent_ && c.serving_epoch == serving_epoch &&
                          (proof == nullptr || c.proven);
  if (!lease_only) {
    // serving_since: when it first reported this epoch (a report of -1 clears it).
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE claims SET expires = ?, last_beat = ?, "
                                             "serving_since = CASE WHEN CAST(?3 AS BIGINT) < 0 "
                                             "THEN 0 WHEN serving_epoch = ?3 THEN serving_since "
                                             "ELSE ?2 END, serving_epoch = ?3 WHERE id = ?4"));
    KV_RETURN_IF_ERROR(
        s.Bind(1, now + lease_s).Bind(2, now).Bind(3, serving_epoch).Bind(4, claim).Run());
  }
  // Only the claim's ring: a heartbeat costs the same whatever the size of its model. Read
  // again only when the database changed since it was last read (ring_cache.cpp).
  const uint64_t mark = db_->ChangeMark();
  std::vector<ModelState> models, fresh;
  const bool cached = RingFromCache(c.model, c.ring, mark, now, &models);
  if (!cached) {
    KV_ASSIGN_OR_RETURN(fresh, ReadModels(now, c.model, c.ring, /*overlay=*/false));
    models = fresh;
    OverlayAll(&models);
  }
  if (models.empty() || static_cast<size_t>(c.ring) >= models[0].rings.size()) {
    return Error("{}: claim {} names a ring that does not exist", db_->path(), claim);
  }
  HeartbeatReply reply;
  reply.ring = models[0].rings[static_cast<size_t>(c.ring)];
  reply.model_id = models[0].model_id;
  KV_ASSIGN_OR_RETURN(reply.claim, ReadClaim(claim));
  if (lease_only) {
    reply.claim.expires = std::max(reply.claim.expires, now + lease_s);
    reply.claim.last_beat = std::max(reply.claim.last_beat, now);
  }
  if (reply.claim.proven && reply.claim.serving_epoch == reply.ring.epoch) {
    // It serves: the evictions it had are forgiven.
    KV_ASSIGN_OR_RETURN(auto f, db_->Prepare("DELETE FROM strikes WHERE node = ?"));
    KV_RETURN_IF_ERROR(f.Bind(1, node).Run());
  }
  if (!reply.claim.proven) KV_RETURN_IF_ERROR(ReadChallenge(claim, &reply));
  KV_RETURN_IF_ERROR(ReadAudits(node, now, &reply.audits));
  KV_RETURN_IF_ERROR(txn->Commit());
  // Kept only as committed, and only if this heartbeat changed nothing after reading it.
  if (!cached && mark != 0 && db_->ChangeMark() == mark) {
    CacheRing(c.model, c.ring, mark, now, std::move(fresh));
  }
  RecordRenewal(claim, node, lease_only ? now + lease_s : 0, lease_only ? now : 0, nonce,
                std::move(stamp), now);
  return reply;
}

Status Store::ReleaseOnce(const std::string& node, int64_t claim, double now) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  KV_ASSIGN_OR_RETURN(ClaimInfo c, ReadClaim(claim));
  if (c.node != node) {
    return Error(StatusCode::kForbidden, "claim {} belongs to node {}, not {}", claim,
                 Short(c.node), Short(node));
  }
  KV_ASSIGN_OR_RETURN(const int64_t model_row, ModelRow(c.model));
  KV_ASSIGN_OR_RETURN(auto d, db_->Prepare("DELETE FROM claims WHERE id = ?"));
  KV_RETURN_IF_ERROR(d.Bind(1, claim).Run());
  KV_RETURN_IF_ERROR(BumpEpoch(model_row, c.ring));
  return txn->Commit();
}

Status Store::RecordCheckOnce(int64_t claim, const std::string& node, const std::string& address,
                              int64_t epoch, const Status& outcome, double now) {
  // No sweep: this only marks rows that are there, and a checker's Store need not know the lease.
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  // Only for the holder and the address that were checked, and only for the epoch checked.
  KV_ASSIGN_OR_RETURN(auto s,
                      db_->Prepare(outcome.ok() ? "UPDATE claims SET verified_epoch = ?, "
                                                  "verified_at = ?, check_error = '' WHERE id = ? "
                                                  "AND node = ? AND address = ?"
                                                : "UPDATE claims SET check_error = ? WHERE id = ? "
                                                  "AND node = ? AND address = ?"));
  if (outcome.ok()) {
    s.Bind(1, epoch).Bind(2, now).Bind(3, claim).Bind(4, node).Bind(5, address);
  } else {
    s.Bind(1, outcome.message().substr(0, 300)).Bind(2, claim).Bind(3, node).Bind(4, address);
  }
  KV_RETURN_IF_ERROR(s.Run());
  return txn->Commit();
}

Result<int64_t> Store::InsertClaim(const ClaimRequest& req, int64_t model_row, double rate,
                                   size_t n_samples, double now, double lease_s) {
  // The challenge: a fresh nonce and kRangesPerChallenge of the window's samples.
  std::string nonce(kProofNonceBytes, '\0');
  randombytes_buf(nonce.data(), nonce.size());
  std::string picks;
  for (int i = 0; n_samples > 0 && i < kRangesPerChallenge; ++i) {
    if (!picks.empty()) picks += ',';
    picks += std::to_string(randombytes_uniform(static_cast<uint32_t>(n_samples)));
  }
  KV_ASSIGN_OR_RETURN(
      auto s, db_->Prepare(fmt::format(
                  "INSERT INTO claims(model, ring, window, node, address, behind_nat, rate, "
                  "created, expires, last_beat, proven, proof_nonce, proof_picks, standby) "
                  "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, {}) RETURNING id",
                  req.standby ? "(SELECT COALESCE(MAX(standby), 0) + 1 FROM claims WHERE model = "
                                "?1 AND ring = ?2 AND window = ?3)"
                              : "0")));
  s.Bind(1, model_row)
      .Bind(2, req.ring)
      .Bind(3, req.window)
      .Bind(4, req.node)
      .Bind(5, req.address)
      .Bind(6, req.behind_nat ? 1 : 0)
      .Bind(7, rate)
      .Bind(8, now)
      .Bind(9, now + lease_s)
      .Bind(10, now)
      .Bind(11, n_samples == 0 ? 1 : 0)
      .Bind(12, ToHex(nonce))
      .Bind(13, picks);
  KV_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return Error("no id returned");
  const int64_t id = s.Int(0);
  KV_RETURN_IF_ERROR(s.Run());  // SQLite commits no statement left halfway
  return id;
}

}  // namespace kvasir::market
