// The half of the Store that makes claims serve (docs/MARKET.md, "Claims must serve"): holders
// prove that they hold their window's bytes, claims of complete rings that do not serve within
// their deadline are evicted, and evicted keys cool down before they may claim again.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include "market/signed_request.h"
#include "market/store.h"
#include "market/store_rows.h"

namespace kvasir::market {

Status Store::Evict(int64_t claim, int64_t model_row, int ring, const std::string& node,
                    double now) {
  KV_ASSIGN_OR_RETURN(auto d, db_->Prepare("DELETE FROM claims WHERE id = ?"));
  KV_RETURN_IF_ERROR(d.Bind(1, claim).Run());
  KV_RETURN_IF_ERROR(BumpEpoch(model_row, ring));
  int64_t count = 0;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT count FROM strikes WHERE node = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, node).Step());
    if (row) count = s.Int(0);
  }
  ++count;
  const int doublings = static_cast<int>(std::min<int64_t>(count - 1, 40));
  const double wait =
      std::min(kMaxCooldownSeconds, eviction_.cooldown_s * std::ldexp(1.0, doublings));
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("INSERT INTO strikes(node, count, until) VALUES(?, ?, "
                                           "?) ON CONFLICT(node) DO UPDATE SET count = "
                                           "excluded.count, until = excluded.until"));
  return s.Bind(1, node).Bind(2, count).Bind(3, now + wait).Run();
}

Status Store::EvictIdle(double now) {
  // Nobody could report serving while the market was down or silent: deadlines start again after.
  KV_ASSIGN_OR_RETURN(const double resumed_at, Meta(kMetaResumedAt));
  KV_ASSIGN_OR_RETURN(const double silence_end, Meta(kMetaSilenceEnd));
  struct Row {
    int64_t claim;
    std::string node;
    double created;
    bool serving, proven;
    uint64_t bytes;
  };
  struct RingRows {
    bool complete = false, all_proven = true;
    double complete_since = 0;          // its newest claim
    std::vector<Row> claims, standbys;  // those that may be due: not proven, or not serving
  };
  std::map<std::pair<int64_t, int>, RingRows> rings;
  {
    // Claims that prove and serve are never due: only the others are read, and only their
    // rings are counted (a scan of the claims, not of every window for each). Nor is a claim
    // younger than the deadline: every deadline below starts at or after its claim's creation
    // (its ring's completion is its newest claim's), so thousands of fresh claims cost the
    // once-a-second scan no ring query (a stall every heartbeat behind it would wait out).
    KV_ASSIGN_OR_RETURN(
        auto s,
        db_->Prepare(
            "SELECT c.id, c.model, c.ring, c.node, c.created, CASE WHEN c.serving_epoch = r.epoch "
            "THEN 1 ELSE 0 END, c.proven, w.bytes, c.standby FROM claims c JOIN rings r ON "
            "r.model = c.model AND r.ring = c.ring JOIN windows w ON w.model = c.model AND "
            "w.ring = c.ring AND w.window = c.window "
            "WHERE c.created <= ?1 AND (c.proven = 0 OR c.serving_epoch <> r.epoch)"));
    s.Bind(1, now - eviction_.deadline_s);
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      RingRows& r = rings[{s.Int(1), static_cast<int>(s.Int(2))}];
      (s.Int(8) > 0 ? r.standbys : r.claims)
          .push_back({s.Int(0), s.Text(3), s.Real(4), s.Int(5) != 0, s.Int(6) != 0,
                      static_cast<uint64_t>(s.Int(7))});
    }
  }
  for (auto& [key, r] : rings) {
    KV_ASSIGN_OR_RETURN(
        auto s,
        db_->Prepare(
            "SELECT (SELECT count(*) FROM windows WHERE model = ?1 AND ring = ?2), count(*), "
            "max(created), min(proven) FROM claims WHERE model = ?1 AND ring = ?2 AND standby = "
            "0"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, key.first).Bind(2, key.second).Step());
    if (!row) continue;
    r.complete = s.Int(1) == s.Int(0);
    r.complete_since = s.Real(2);
    r.all_proven = s.Int(3) != 0;
  }
  const double origin = std::max(resumed_at, silence_end);
  for (auto& [key, r] : rings) {
    const bool complete = r.complete, all_proven = r.all_proven;
    const double complete_since = std::max(origin, r.complete_since);
    for (const Row& c : r.claims) {
      // Proving the bytes needs no neighbour: a holder has its deadline for that from its own
      // claim, complete ring or not (so keys that come and go cannot keep a squatter's deadline
      // from running). Serving needs the whole ring: once every holder proved its bytes, those
      // that do not serve have their deadline from the ring's completion (the market cannot tell
      // from outside which of them keeps a link down).
      double start = 0;
      if (!c.proven) {
        start = std::max(origin, c.created);
      } else if (complete && all_proven && !c.serving) {
        start = complete_since;
      } else {
        continue;
      }
      const double deadline =
          start + eviction_.deadline_s + static_cast<double>(c.bytes) / eviction_.floor_bytes_per_s;
      if (now < deadline) continue;
      KV_RETURN_IF_ERROR(Evict(c.claim, key.first, key.second, c.node, now));
    }
    // Standbys have the same deadlines: to prove their bytes from their claim, and, once the
    // ring is complete and proven, to report serving its epoch (their stage is up, waiting to
    // be adopted) from the later of its completion and their claim.
    for (const Row& c : r.standbys) {
      double start = 0;
      if (!c.proven) {
        start = std::max(origin, c.created);
      } else if (complete && all_proven && !c.serving) {
        start = std::max(complete_since, c.created);
      } else {
        continue;
      }
      const double deadline =
          start + eviction_.deadline_s + static_cast<double>(c.bytes) / eviction_.floor_bytes_per_s;
      if (now < deadline) continue;
      KV_RETURN_IF_ERROR(Evict(c.claim, key.first, key.second, c.node, now));
    }
  }
  return Status::Ok();
}

Result<Store::Challenge> Store::LoadChallenge(int64_t claim) {
  KV_ASSIGN_OR_RETURN(
      auto s, db_->Prepare("SELECT c.proof_nonce, c.proof_picks, w.samples FROM claims c JOIN "
                           "windows w ON w.model = "
                           "c.model AND w.ring = c.ring AND w.window = c.window WHERE c.id = ?"));
  KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, claim).Step());
  if (!row) return Error(StatusCode::kNotFound, "claim {} is gone", claim);
  Challenge out;
  out.nonce_hex = s.Text(0);
  const std::string picks = s.Text(1);
  KV_ASSIGN_OR_RETURN(auto samples, SamplesFromJson(s.Text(2)));
  for (size_t pos = 0; pos < picks.size();) {
    size_t end = picks.find(',', pos);
    if (end == std::string::npos) end = picks.size();
    size_t pick = 0;
    const auto [p, ec] = std::from_chars(picks.data() + pos, picks.data() + end, pick);
    pos = end + 1;
    if (ec != std::errc() || pick >= samples.size()) {
      return Error("{}: claim {}: a challenge names a missing sample", db_->path(), claim);
    }
    out.picked.push_back(samples[pick]);  // a sample may be picked twice
  }
  return out;
}

Status Store::CheckProof(const ClaimInfo& c, const ProofAnswer& proof) {
  KV_ASSIGN_OR_RETURN(Challenge ch, LoadChallenge(c.id));
  KV_ASSIGN_OR_RETURN(std::string nonce, FromHex(ch.nonce_hex, kProofNonceBytes));
  if (proof.nonce != ch.nonce_hex) {
    return Error(StatusCode::kForbidden, "claim {}: the proof answers nonce {}, not the claim's {}",
                 c.id, proof.nonce.substr(0, 32), ch.nonce_hex);
  }
  if (proof.digests.size() != ch.picked.size()) {
    return Error(StatusCode::kForbidden, "claim {}: the proof has {} digests, the challenge {}",
                 c.id, proof.digests.size(), ch.picked.size());
  }
  for (size_t i = 0; i < ch.picked.size(); ++i) {
    const RangeSample& sample = ch.picked[i];
    if (proof.digests[i] != ProofDigest(nonce, sample.bytes)) {
      return Error(StatusCode::kForbidden,
                   "claim {}: the proof's digest {} of tensor {} bytes [{}, +{}) does not match "
                   "the model's: node {} does not hold window {} of ring {} of '{}'",
                   c.id, i, sample.range.tensor, sample.range.offset, sample.range.length,
                   Short(c.node), c.window, c.ring, c.model);
    }
  }
  KV_ASSIGN_OR_RETURN(auto u, db_->Prepare("UPDATE claims SET proven = 1 WHERE id = ?"));
  return u.Bind(1, c.id).Run();
}

Status Store::ReadChallenge(int64_t claim, HeartbeatReply* reply) {
  KV_ASSIGN_OR_RETURN(Challenge ch, LoadChallenge(claim));
  reply->challenge_nonce = std::move(ch.nonce_hex);
  for (RangeSample& sample : ch.picked) reply->challenge.push_back(std::move(sample.range));
  return Status::Ok();
}

}  // namespace kvasir::market
