// The market's state in SQLite (docs/MARKET.md): models and their rings of windows, claims
// (leases), demand, seen nonces, receipts, balances and each ring's credit allowance. Every method
// that changes state is one transaction, so a crash (kill -9 included) loses nothing a caller was
// told had happened. Expired claims are swept at the start of every transaction, so "held" always
// means "held now"; leases do not run while the market is silent (it answered no heartbeat for
// half a lease: it was down or flooded), and every claim gets a full lease when it answers again
// (docs/MARKET.md, "Grace"). Times are Unix seconds (wall clock): leases outlive a restart of the
// market. Not thread-safe: one Store per thread (several Stores, in one process or several, may
// share a database file), but for WriteLeaseFlush, which another thread may run beside it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "market/audit.h"
#include "market/lease_table.h"
#include "market/proof.h"
#include "market/sql.h"

namespace kvasir::market {

// Requests for a ring from one address count as demand at most once in this many seconds.
inline constexpr double kDemandSpacingSeconds = 10;
// Demand and sessions count for the reward over this many seconds.
inline constexpr double kRecentSeconds = 600;
// A silence (no heartbeat answered for half a lease) stops leases for at most this long, so a
// holder that vanished with everyone else cannot keep a window for ever.
inline constexpr double kMaxForgivenSilenceSeconds = 600;
// A ring's unused credit allowance is kept for at most this many seconds of its rate.
inline constexpr double kCreditBurstSeconds = 60;
// The longest cool-down an evicted key waits before it may claim again.
inline constexpr double kMaxCooldownSeconds = 86400;
// Standbys a window may have at once: keys are free, and every heartbeat of a neighbour names
// them all (and its stage may dial each), so a flood of keys must not grow either.
inline constexpr size_t kMaxStandbysPerWindow = 4;

// When claims that do not serve are evicted (docs/MARKET.md, "Claims must serve"). A claim in a
// complete ring must serve the ring's epoch (and have proved that it holds its window's bytes)
// within deadline_s + the window's bytes / floor_bytes_per_s of the ring becoming complete (or
// of the market process starting, if later); an evicted key may claim again only after
// cooldown_s x 2^(evictions - 1) (at most kMaxCooldownSeconds), and its count of evictions is
// forgotten once one of its claims serves.
struct EvictionPolicy {
  double deadline_s = 60;
  double floor_bytes_per_s = 10e6;
  double cooldown_s = 60;
};

struct TensorDigest {
  std::string name;
  std::string sha256;  // 64 hex digits
};

struct WindowSpec {
  int first = 0, last = 0;  // layers [first, last)
  uint64_t bytes = 0;       // weights held
  uint64_t memory = 0;      // weights + KV at ctx + runtime
  std::vector<TensorDigest> tensors;
  // Ranges of the window's tensors with their bytes, for challenging holders (proof.h); none for
  // a window added by an older market, whose holders are not challenged.
  std::vector<RangeSample> samples;
};

struct ModelSpec {
  std::string name;      // 1-64 of A-Z a-z 0-9 . _ -
  std::string model_id;  // 32 hex digits
  std::string url;       // where stages fetch the full GGUF
  int n_layer = 0;
  int ctx = 0;  // tokens of context each stage reserves: a session runs at most this many rows
  // The most token rows per second one ring of the model can run (model_spec.h says how it is
  // estimated): receipts are credited up to it.
  double max_rows_per_s = 0;
  std::vector<std::vector<WindowSpec>> rings;  // [ring][window], each ring tiling [0, n_layer)
};

// An audit for the recompute auditor: the reveal of line `line` of `receipt`, by `node`, of the
// window [first, last) of `model`.
struct RecomputeJob {
  int64_t audit = 0;
  std::string node, receipt, model;
  int64_t line = 0;
  int first = 0, last = 0;
  ring::RowReveal reveal;
};

// A claim as stored.
struct ClaimInfo {
  int64_t id = 0;
  std::string model;  // name
  int ring = 0, window = 0;
  std::string node;     // public key, 64 hex digits
  std::string address;  // HOST:PORT, empty when behind NAT
  bool behind_nat = false;
  double rate = 1;
  double created = 0, expires = 0, last_beat = 0;
  int64_t serving_epoch = -1;
  double serving_since = 0;     // when it first reported serving_epoch (0: not serving)
  int64_t verified_epoch = -1;  // the ring epoch for which the market's check of it passed
  double verified_at = 0;
  std::string check_error;  // why the last check failed, or empty
  // Whether the holder proved that it holds the window's bytes (always, for a window without
  // samples). Until it has, it does not count as serving.
  bool proven = true;
  // A standby for the window (docs/MARKET.md, "Standbys"): it serves nothing until the window's
  // claim is gone, when the oldest proven standby becomes the window's claim (same id).
  bool standby = false;
  // Whether the market dials it before its ring is ready (it has an address).
  bool checked() const { return !behind_nat; }
};

struct WindowState {
  int window = 0;
  int first = 0, last = 0;
  uint64_t bytes = 0, memory = 0;
  double rate = 1;  // the holder's locked rate, or what a claim would lock now
  std::optional<ClaimInfo> claim;
  std::vector<ClaimInfo> standbys;  // oldest first
};

struct RingState {
  int ring = 0;
  int64_t epoch = 0;
  bool complete = false;   // every window claimed
  bool serving = false;    // and every holder serves this epoch
  bool ready = false;      // and the market's check of every holder with an address passed
  double ready_since = 0;  // when it became ready (the last of those events); 0 when not ready
  std::vector<WindowState> windows;
};

struct ModelState {
  std::string name, model_id, url;
  int n_layer = 0, ctx = 0;
  double max_rows_per_s = 0;
  int64_t demand_total = 0;     // answered ring requests, all time
  int64_t requests_recent = 0;  // answered ring requests in the last kRecentSeconds
  int64_t sessions_recent = 0;  // receipts credited in the last kRecentSeconds
  // What the reward counts: requests, but no more than the sessions receipts confirm.
  int64_t demand_recent = 0;
  std::vector<RingState> rings;
};

struct ClaimRequest {
  std::string node;  // 64 hex
  std::string model;
  int ring = 0, window = 0;
  std::string address;  // empty when behind_nat
  bool behind_nat = false;
  // Stand by for the window (held by another node) instead of claiming it (standby.cpp).
  bool standby = false;
};

struct ClaimGrant {
  ClaimInfo claim;
  ModelState model;  // without rings
  WindowSpec window;
  bool renewed = false;  // the node already held this window
};

struct HeartbeatReply {
  ClaimInfo claim;
  RingState ring;
  std::string model_id;  // 32 hex digits
  // While the claim has not proved its bytes: the challenge to answer (nonce as 32 hex digits).
  std::string challenge_nonce;
  std::vector<ProofRange> challenge;
  // Audits of this node's work waiting for its reveal (docs/MARKET.md, "Audits").
  std::vector<AuditRequest> audits;
};

// The nonce of a signed request (signed_request.h), recorded in the transaction of the request's
// own work so that a heartbeat is one transaction, not two; kept keep_s seconds. On SQLite with
// renewals in memory a heartbeat's is not recorded: its claim's BeatStamp refuses a replay by the
// request's signed `time` instead (docs/MARKET.md, "Replayed heartbeats").
struct RequestNonce {
  std::string nonce;  // 32 hex digits
  double keep_s = 0;
  int64_t time = 0;  // the request's signed time, Unix seconds
};

// A holder's answer to its claim's challenge, sent with a heartbeat.
struct ProofAnswer {
  std::string nonce;                 // 32 hex digits, the challenge's
  std::vector<std::string> digests;  // 64 hex digits each, in the challenge's order
};

// One signer's share of a receipt, as the caller verified it.
struct ReceiptShare {
  std::string node;  // 64 hex
  int first = 0, last = 0;
  uint64_t tokens = 0;
  std::string rows_root;  // 64 hex: the line's commitment to its rows
};

struct CreditLine {
  std::string node;
  int first = 0, last = 0;
  uint64_t work = 0;  // tokens x layers
  double credit = 0;
};

struct ReceiptRecord {
  std::string id;  // 32 hex
  std::string model;
  int ring = 0;
  uint64_t tokens = 0;
  double time = 0;
  std::vector<CreditLine> lines;
};

struct Balance {
  std::string node;
  double credit = 0;
  uint64_t work = 0;
  int64_t receipts = 0;
  int64_t audits_passed = 0, audits_failed = 0, audits_disputed = 0;
};

// rate = (1 + d) * (1 + u), rounded to 3 decimals: d = min(4, recent demand / 10), u = the
// fraction of the model's windows that are uncovered.
double RewardRate(int64_t recent_demand, int uncovered_windows, int total_windows);

class Store {
 public:
  // Opens or creates the database and its schema (adding the columns a database made by an
  // older market lacks): a SQLite file, or a `postgresql://` URL (sql.h). Several Stores, in one
  // process or several, may share one database.
  static Result<std::unique_ptr<Store>> Open(const std::string& path);

  // The lease the market runs with: the silence that stops leases is half of it, and the grace
  // after one is all of it. MarketApi sets it from its configuration.
  void set_lease_s(double lease_s) { lease_s_ = lease_s; }
  void set_eviction(const EvictionPolicy& policy) { eviction_ = policy; }
  // Whether a standby is promoted only once the market's check of it passed (its last check;
  // MarketApi turns this on when it has a checker, which dials every standby that serves).
  void set_check_standbys(bool on) { check_standbys_ = on; }
  void set_audit(const AuditPolicy& policy) {
    audit_ = policy;
    audit_rng_.seed(policy.seed);
  }
  // Renewals that change nothing but a lease (a heartbeat of the same serving epoch, no proof,
  // outside a silence) wait in memory up to `seconds` and are then written together, in one
  // transaction (FlushLeases); 0, the default, writes each in its heartbeat's transaction. While
  // one waits, this Store's answers and its lapse decisions use it (docs/MARKET.md, "Renewals
  // in memory").
  void set_lease_flush_s(double seconds) { lease_flush_s_ = seconds; }
  // Whether the oldest renewal waiting in memory has waited lease_flush_s (or the clock stepped
  // back).
  bool LeaseFlushDue(double now) const;
  // Writes every renewal waiting in memory, in one transaction; on failure they stay and go with
  // the next flush.
  Status FlushLeases(double now);
  size_t pending_leases() const { return leases_.size(); }
  // What waits (not what a flush is writing), by claim id.
  const PendingLeases& waiting_leases() const { return leases_.pending(); }
  // Heartbeats answered in two round trips (postgres_heartbeat.cpp), since this Store opened.
  uint64_t pipelined_heartbeats() const { return pipelined_heartbeats_; }
  // Heartbeats answered in a read-only transaction (sqlite_heartbeat.cpp), since this Store opened.
  uint64_t read_only_heartbeats() const { return read_only_heartbeats_; }

  // The flush written on a thread of its own (lease_flush.cpp; docs/MARKET.md, "The flush"), on
  // SQLite only: a connection of its own to the database, so the Store's thread goes on answering
  // heartbeats from memory (WAL) while it writes. Once enabled, a heartbeat never flushes; the
  // caller runs TakeLeaseFlush, then WriteLeaseFlush without the Store's lock, then
  // EndLeaseFlush. False (nothing enabled) on PostgreSQL and for a database in memory.
  Result<bool> EnableBackgroundFlush();
  bool background_flush() const { return flush_db_ != nullptr; }
  // On the Store's thread: when a flush is due and none is being written, hands every renewal
  // waiting in memory to one (they stay in this Store's answers and decisions until it ended);
  // null otherwise.
  std::shared_ptr<const PendingLeases> TakeLeaseFlush(double now);
  // On any one thread, without the Store's lock: writes `batch` in one transaction on the flush
  // connection (waiting for the database's write lock, as long as its busy timeout).
  Status WriteLeaseFlush(const PendingLeases& batch);
  // On the Store's thread, after WriteLeaseFlush: `written` failed puts the batch back in memory
  // (merged with what was renewed since, never shortening it), for the next flush.
  void EndLeaseFlush(const Status& written, double now);
  bool lease_flush_in_flight() const { return in_flight_ != nullptr; }
  // Tests: runs inside the flush's transaction on the flush connection, before its commit; an
  // error fails the flush.
  void set_flush_hook(std::function<Status()> hook) { flush_hook_ = std::move(hook); }

  // The database, as messages name it (a path, or a URL without its password).
  const std::string& db_name() const { return db_->path(); }
  // Marks the start of a market process: the time it was down counts as silence with no limit
  // (only the silence after the start is limited to kMaxForgivenSilenceSeconds).
  Status Resume(double now);

  // Registers a model. kConflict when the name exists and !replace (replace drops its claims).
  // A model with max_rows_per_s 0 is listed and claimed, but its receipts earn nothing.
  Status AddModel(const ModelSpec& spec, bool replace, double now);

  // Takes (or renews, when the node holds it) a window for lease_s. kNotFound for an unknown
  // model, ring or window; kConflict when another node holds the window or this node holds
  // another claim; kInvalidInput when window 0 is claimed without an address; kForbidden while
  // the node cools down after an eviction (the message says for how long).
  Result<ClaimGrant> Claim(const ClaimRequest& request, double now, double lease_s);
  // Renews the node's claim and records the epoch it serves (-1: not serving). kNotFound when
  // the claim is gone, kForbidden when it is another node's. The first heartbeat after a silence
  // gives every claim a full lease from `now`. `proof` answers the claim's challenge: a wrong
  // answer evicts the claim (kForbidden, naming the range that did not match). With `nonce`, the
  // request's nonce is recorded first, as UseNonce does (kUnauthenticated when it was used).
  Result<HeartbeatReply> Heartbeat(const std::string& node, int64_t claim, int64_t serving_epoch,
                                   double now, double lease_s, const ProofAnswer* proof = nullptr,
                                   const RequestNonce* nonce = nullptr);
  // Releases the node's claim (kNotFound, kForbidden as for Heartbeat).
  Status Release(const std::string& node, int64_t claim, double now);

  // The whole map (every model, ring and window) as of `now`.
  Result<std::vector<ModelState>> Map(double now);
  // A ready ring of `model` for a client, counting one request of demand (at most one per
  // `source` address every kDemandSpacingSeconds, so one client cannot inflate rewards; a request
  // no ring could answer counts nothing). kNotFound for an unknown model, kUnavailable when no
  // ring is ready (the message says what is missing).
  Result<std::pair<ModelState, RingState>> PickRing(const std::string& model,
                                                    const std::string& source, double now);

  // Records the outcome of the market's check of a claim's holder for ring epoch `epoch`
  // (ring_check.h). Ignored when the claim is gone or now has another holder or address.
  Status RecordCheck(int64_t claim, const std::string& node, const std::string& address,
                     int64_t epoch, const Status& outcome, double now);

  // Records a nonce of a signed request; false when this node used it before.
  Result<bool> UseNonce(const std::string& node, const std::string& nonce, double now,
                        double keep_s);

  // Credits a receipt: `shares` in ring order must be the current holders of one ready ring of
  // `model` with their windows, tiling the model, with equal token counts from 1 to the model's
  // ctx, and the ring's allowance (max_rows_per_s for every second it has been ready, at most
  // kCreditBurstSeconds of it unused) must cover the tokens, which it then uses up. Refusals are
  // kInvalidInput with the reason ("duplicate receipt", "line 2: node 3fa9... does not hold
  // window 2 of ring 0"). `verify` checks the signatures; it runs only once the cheap checks
  // passed, so a flood of receipts from strangers costs no signature verification, and a forged
  // receipt uses up no allowance.
  Result<ReceiptRecord> CreditReceipt(const std::string& receipt_id, const std::string& model_id,
                                      const std::vector<ReceiptShare>& shares,
                                      const std::string& payload, double now,
                                      const std::function<Status()>& verify);

  // Checks the node's answers to its audits (audit.h): each must be the node's; a reveal of the
  // positions asked whose every leaf is on its path to the receipt line's commitment passes; any
  // other reveal, or a refusal, fails: the line's credit is forfeited, the node is banned for
  // AuditPolicy::ban_s, doubling with each offence (at most a day), and its claim is evicted.
  // An audit answered before keeps its first outcome. kNotFound / kForbidden for an audit that
  // does not exist or is another node's.
  Status AnswerAudits(const std::string& node, const std::vector<AuditAnswer>& answers, double now);

  // Audits of `model`'s receipts whose reveal matched its commitment (passed, or disputed with a
  // neighbour) and that no auditor has recomputed yet, oldest first, at most `limit`
  // (audit_recompute.cpp; the worker is audit/auditor.h).
  Result<std::vector<RecomputeJob>> PendingRecomputes(const std::string& model, int limit);
  // Records an auditor's verdict on audit `id`: `failure` empty, the recomputed rows matched
  // (`note` says how closely); otherwise the audit fails as a bad reveal does (the line's credit
  // forfeited unless a dispute holds it already, the node banned and evicted). The first verdict
  // stands; an audit failed meanwhile is left as it is.
  Status RecordRecompute(int64_t id, const std::string& note, const std::string& failure,
                         double now);

  // Every node with credit, highest first, with its audits passed and failed.
  Result<std::vector<Balance>> Balances();
  // The latest `limit` receipts, or all of one node's when `node` is not empty.
  Result<std::vector<ReceiptRecord>> Receipts(const std::string& node, int limit);

  // Counts for /health.
  Result<std::pair<int64_t, int64_t>> Counts(double now);  // models, live claims

 private:
  explicit Store(std::unique_ptr<Db> db) : db_(std::move(db)) {}
  // Runs `once` (one transaction) again while it failed for a concurrent transaction of another
  // connection (PostgreSQL's serialization failures: each round of a conflict lets one of its
  // transactions commit), at most kMaxAttempts times in all, after a short random wait that grows.
  template <class F>
  auto Retry(F&& once) -> decltype(once()) {
    constexpr int kMaxAttempts = 64;
    for (int attempt = 1;; ++attempt) {
      auto r = once();
      if (r.ok() || !db_->TakeRetryable() || attempt == kMaxAttempts) return r;
      BackOff(attempt);
    }
  }
  static void BackOff(int attempt);
  // The public methods' single attempts.
  Status ResumeOnce(double now);
  Status AddModelOnce(const ModelSpec& spec, bool replace, double now);
  Result<ClaimGrant> ClaimOnce(const ClaimRequest& request, double now, double lease_s);
  Result<HeartbeatReply> HeartbeatOnce(const std::string& node, int64_t claim,
                                       int64_t serving_epoch, double now, double lease_s,
                                       const ProofAnswer* proof, const RequestNonce* nonce);
  // postgres_heartbeat.cpp: HeartbeatOnce on PostgreSQL in two round trips (Db::RunBatch), for
  // the common heartbeat: nothing to sweep, promote or evict, no silence, a proven claim of this
  // node, no audit open. Anything else rolls back, answers nullopt, and goes the general way.
  Result<std::optional<HeartbeatReply>> PipelinedHeartbeat(const std::string& node, int64_t claim,
                                                           int64_t serving_epoch, double now,
                                                           double lease_s,
                                                           const RequestNonce* nonce);
  Status ReleaseOnce(const std::string& node, int64_t claim, double now);
  Result<std::vector<ModelState>> MapOnce(double now);
  Result<std::pair<ModelState, RingState>> PickRingOnce(const std::string& model,
                                                        const std::string& source, double now);
  Status RecordCheckOnce(int64_t claim, const std::string& node, const std::string& address,
                         int64_t epoch, const Status& outcome, double now);
  Result<bool> UseNonceOnce(const std::string& node, const std::string& nonce, double now,
                            double keep_s);
  Result<ReceiptRecord> CreditReceiptOnce(const std::string& receipt_id,
                                          const std::string& model_id,
                                          const std::vector<ReceiptShare>& shares,
                                          const std::string& payload, double now,
                                          const std::function<Status()>& verify);
  Result<std::pair<int64_t, int64_t>> CountsOnce(double now);
  // sqlite_heartbeat.cpp: HeartbeatOnce on SQLite with renewals in memory, in a read-only
  // transaction (it waits for no flush being written), for the common heartbeat: a lease-only
  // renewal of a proven claim of this node, nothing to sweep, promote, evict or forgive, no
  // silence, no audit open, and no once-a-second housekeeping due unless a flush is being written
  // (it waits for the next heartbeat). Anything else answers nullopt and goes the general way.
  Result<std::optional<HeartbeatReply>> ReadOnlyHeartbeat(const std::string& node, int64_t claim,
                                                          int64_t serving_epoch, double now,
                                                          double lease_s, const ProofAnswer* proof,
                                                          const RequestNonce* nonce);
  // Inside a transaction: records `node`'s nonce; false when it was used before.
  Result<bool> InsertNonce(const std::string& node, const std::string& nonce, double now,
                           double keep_s);
  Status AnswerAuditsOnce(const std::string& node, const std::vector<AuditAnswer>& answers,
                          double now);
  Status RecordRecomputeOnce(int64_t id, const std::string& note, const std::string& failure,
                             double now);
  // audit_store.cpp, inside a transaction: picks (by AuditPolicy::rate) whether the credited
  // receipt is audited and asks each line's signer for a few positions.
  Status CreateAudits(const ReceiptRecord& rec, const std::vector<ReceiptShare>& shares,
                      double now);
  // Fails every audit past its deadline (whoever held it), then reads `node`'s open requests.
  Status ReadAudits(const std::string& node, double now, std::vector<AuditRequest>* out);
  // After audit `id` (line `line` of `receipt`) passed with `reveal`: compares the rows it gave out
  // and took in with those its neighbours revealed; where they disagree, both audits are disputed.
  Status CompareNeighbours(int64_t id, const std::string& receipt, int64_t line,
                           const ring::RowReveal& reveal);
  // After disputed audit `id` failed its recomputation: the neighbour it was disputed with is
  // cleared of the dispute (its held credit given back, the audit passed again, still to be
  // recomputed itself).
  Status ReleaseDisputeOf(int64_t id);
  // Holds the audited line's credit (taken from the balance) while the audit is disputed.
  Status Dispute(int64_t id, const std::string& node, int64_t work, double credit,
                 const std::string& reason);
  // Forfeits the audited line's credit, bans the node (longer each time), evicts its claim.
  Status FailAudit(int64_t id, const std::string& node, int64_t work, double credit,
                   const std::string& reason, double now);
  // Why the node may not claim now after failed audits; nothing when it may.
  Result<std::optional<std::string>> AuditBan(const std::string& node, double now);
  Status ReadAuditCounts(std::vector<Balance>* balances);
  // Expires what is due (claims by the lease clock, old nonces and demand) and notes whether the
  // market is in a silence. Every transaction starts with it.
  Status Sweep(double now);
  Result<double> Meta(const char* key);
  Status SetMeta(const char* key, double value);
  Status BumpEpoch(int64_t model_row, int ring);
  // Evicts the claims of complete rings that missed their deadline to serve (EvictionPolicy).
  Status EvictIdle(double now);
  // Gives every window without a claim to its oldest proven standby whose last check passed
  // (when set_check_standbys; one that did not answer is skipped) (standby.cpp): that claim
  // becomes the window's, and the ring's epoch changes.
  Status PromoteStandbys(double now);
  // The standby half of ClaimOnce (standby.cpp), inside its transaction: `w` is the window asked
  // for (the node holds no other claim), `n_samples` its range samples. Renews the node's standby
  // of it, or inserts one with a fresh challenge; returns its id and whether it was renewed.
  Result<std::pair<int64_t, bool>> StandBy(const ClaimRequest& req, int64_t model_row,
                                           const WindowState& w, size_t n_samples, double now,
                                           double lease_s);
  // Inserts the claim (standby: the window's next standby number) of `req` with a fresh challenge
  // of kRangesPerChallenge of its `n_samples` range samples (proven at once when it has none);
  // returns its id, or the database's refusal (another node took the place first).
  Result<int64_t> InsertClaim(const ClaimRequest& req, int64_t model_row, double rate,
                              size_t n_samples, double now, double lease_s);
  // Deletes a claim as evicted (epoch bumped, the node's cool-down started).
  Status Evict(int64_t claim, int64_t model_row, int ring, const std::string& node, double now);
  // A claim's challenge: its nonce (hex) and the samples it picked, with their
  // bytes.
  struct Challenge {
    std::string nonce_hex;
    std::vector<RangeSample> picked;
  };
  Result<Challenge> LoadChallenge(int64_t claim);
  // Checks `proof` against the claim's challenge; marks the claim proven when it matches.
  Status CheckProof(const ClaimInfo& c, const ProofAnswer& proof);
  // The claim's challenge (nonce and ranges, without their bytes) into `reply`.
  Status ReadChallenge(int64_t claim, HeartbeatReply* reply);
  Result<int64_t> ModelRow(const std::string& name);
  // Every model, or only the one named `only`; with `only_ring` >= 0, the windows and claims of
  // that ring only (the other rings come without them: what a heartbeat needs).
  // `overlay`: with the renewals in memory laid over the claims (OverlayAll).
  Result<std::vector<ModelState>> ReadModels(double now, const std::string& only,
                                             int only_ring = -1, bool overlay = true);
  // ring_cache.cpp. The state of one ring as a heartbeat reads it (ReadModels of that ring,
  // without the renewals in memory), kept while the database is unchanged (Db::ChangeMark) and
  // for at most kRingCacheSeconds (its counts of recent demand move with the clock): a heartbeat
  // that changes nothing answers from it instead of reading its ring again.
  // Into `*out` with the renewals laid over it; false when none is valid under `mark`.
  bool RingFromCache(const std::string& model, int ring, uint64_t mark, double now,
                     std::vector<ModelState>* out);
  // Keeps `fresh` (ReadModels of that ring without overlay, read under `mark`).
  void CacheRing(const std::string& model, int ring, uint64_t mark, double now,
                 std::vector<ModelState> fresh);
  void OverlayAll(std::vector<ModelState>* models) const;
  Result<ClaimInfo> ReadClaim(int64_t claim);
  // lease_flush.cpp. The lease and last heartbeat of `c` as this Store answered them (a renewal
  // waiting in memory, or being written, is later than the row).
  void Overlay(ClaimInfo* c) const;
  // What waits in memory for `claim` of `node` (waiting and being written, merged); false when
  // nothing does.
  bool InMemory(int64_t claim, const std::string& node, PendingLease* out) const;
  // Inside Sweep's transaction: writes the waiting renewals of the claims that `due` (an SQL
  // condition on claims with Sweep's parameters ?1 ?2 ?3) would expire, so none lapses that was
  // renewed in memory. They stay in memory (the transaction may yet roll back).
  Status WriteRenewalsDue(const char* due, double silence_start, double lease_clock, double now);
  // Writes `pending` on `db` (FlushLeases: the Store's own; WriteLeaseFlush: the flush's).
  Status FlushLeasesOnce(Db* db, const PendingLeases& pending);
  // Whether a heartbeat's replay is refused by its claim's BeatStamp, kept in memory and written
  // with the renewals, instead of by a nonce row written in its transaction: with SQLite and
  // renewals in memory. PostgreSQL writes each nonce (another process on the database must see it
  // at once).
  bool StampsInMemory() const { return lease_flush_s_ > 0 && !db_->postgres(); }
  // Inside a transaction, with StampsInMemory: the stamp of `claim` of `node`, the row's merged
  // with memory's.
  Result<BeatStamp> StampOf(int64_t claim, const std::string& node);
  // kUnauthenticated when `stamp` refuses the heartbeat signed with `nonce`.
  static Status CheckStamp(const BeatStamp& stamp, const RequestNonce& nonce,
                           const std::string& node);
  // After a heartbeat committed: its renewal (0, 0: none) and the claim's stamp as checked
  // (StampOf) with this heartbeat's added wait for the next flush.
  void RecordRenewal(int64_t claim, const std::string& node, double expires, double last_beat,
                     const RequestNonce* nonce, BeatStamp stamp, double now);
  std::unique_ptr<Db> db_;
  double lease_s_ = 30;
  EvictionPolicy eviction_;
  bool check_standbys_ = false;
  AuditPolicy audit_;
  std::mt19937_64 audit_rng_;  // the draws when audit_.seed is set
  double evict_scan_at_ = 0;   // `now` of the last scan for idle claims
  double nonce_sweep_at_ = 0;  // `now` of the last deletion of expired nonces
  double last_beat_ = 0;       // the last heartbeat answered, as of the last Sweep
  bool silent_ = false;        // as of the last Sweep: no heartbeat answered for half a lease
  LeaseTable leases_;          // renewals answered but not yet written
  // Renewals a flush is writing on flush_db_ (null: none); read-only while it is set.
  std::shared_ptr<const PendingLeases> in_flight_;
  std::unique_ptr<Db> flush_db_;  // the background flush's connection (EnableBackgroundFlush)
  std::function<Status()> flush_hook_;
  struct CachedRing {
    double filled_at = 0;
    ModelState state;  // one ring's windows and claims, as ReadModels without overlay
  };
  std::map<std::pair<std::string, int>, CachedRing> ring_cache_;  // by model name, ring
  uint64_t ring_cache_mark_ = 0;  // the Db::ChangeMark every entry was read under
  double lease_flush_s_ = 0;
  double flushed_at_ = 0;  // `now` of the last flush, or of the oldest renewal waiting since
  uint64_t pipelined_heartbeats_ = 0;
  uint64_t read_only_heartbeats_ = 0;
};

}  // namespace kvasir::market
