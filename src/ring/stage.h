// A ring stage: one process, one layer window, two links. It accepts its predecessor (and, on the
// head stage, clients) on its listen address and dials its successor, retrying with backoff so
// stages can start in any order. See docs/PROTOCOL.md for the session flow.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "net/stream.h"
#include "ring/handshake.h"
#include "ring/node_key.h"
#include "ring/row_store.h"
#include "ring/wire.h"
#include "spec/drafter.h"

namespace kvasir::ring {

// Drafted and accepted tokens of a stage's drafter, over all its sessions.
struct DraftTotals {
  std::string drafter;  // "ngram", "model"; empty: this stage does not draft
  uint64_t steps = 0;   // verify chunks
  uint64_t drafted = 0;
  uint64_t accepted = 0;
  // Overlap (--draft-windows > 1): windows sent on a guess, and those whose guess held.
  uint64_t guessed = 0;
  uint64_t confirmed = 0;
  double acceptance() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0; }
};

// Opens a link some other way than direct TCP (the relay: src/relay). `cancelled` turns true when
// the stage stops; a dial in progress should give up soon after. Called from one thread at a time.
using DialHook =
    std::function<Result<std::unique_ptr<net::Stream>>(const std::function<bool()>& cancelled)>;

// A stage of a neighbouring window's standbys, as the market lists it (docs/MARKET.md,
// "Standbys"): accepted with its key, and dialed (the successor's) at `address` or through `dial`.
struct StandbyPeer {
  PublicKey key{};
  std::string address;  // HOST:PORT; unused with `dial`
  DialHook dial;        // through the relay
  std::string via;      // what `dial` reaches, for logs
};

struct StageOptions {
  std::string model_path;
  int first = 0;  // layers [first, last)
  int last = 0;
  std::string listen;  // HOST:PORT to accept the predecessor (and clients, on the head)
  // Instead of binding `listen`: an inherited socket already bound and listening. Create() takes
  // it over (and closes it when it fails).
  int listen_fd = -1;
  std::string next;  // HOST:PORT of the successor (unused with dial_next)
  // Repair (docs/PROTOCOL.md, "Repair"): more HOST:PORTs for the successor's window (hot
  // standbys), tried in turn after `next` when the successor cannot be reached or answers no
  // handshake, and again whenever the link drops.
  std::vector<std::string> standby_peers;
  // A hot standby: loads its window, listens and authenticates, but dials its successor only
  // once a predecessor has linked to it (it has been adopted in place of a stage that died). Not
  // for the head's window: clients hold the head's address.
  bool standby = false;
  // How long a stage holds the sessions crossing a link that went down, waiting for the ring to
  // be repaired (a standby linked, the same stage back) and the head to replay them, before they
  // end with an error. 0: they end at once.
  int repair_timeout_ms = 30000;
  // The boundary rows sent on for the live sessions, kept up to this many bytes so that a replay
  // sends them on again instead of recomputing them (ring/replay_rows.h); 0: a replay recomputes
  // every position on every stage.
  size_t replay_bytes = size_t{64} << 20;
  // Dial hooks, set by the CLI for relayed links; ring itself knows nothing of WebSockets.
  // dial_next replaces dialing `next` over TCP (same retries and backoff). dial_pred adds a
  // thread that keeps exactly one predecessor link open through it: dial, serve the link as an
  // accepted predecessor, redial when it ends. The listener keeps accepting clients and direct
  // predecessors either way.
  DialHook dial_next;
  std::string next_via;  // what dial_next reaches, for logs ("wss://relay/edge/r1-r2")
  DialHook dial_pred;
  std::string pred_via;
  // A standby behind NAT: its check edge (docs/MARKET.md, "Checked before promoted"), kept
  // dialed like dial_pred whatever links the stage has, so the market can check its key while a
  // predecessor holds their edge.
  DialHook dial_check;
  std::string name;  // for logs and stats; defaults to "stage-<first>-<last>"
  int n_threads = 1;
  std::string backend = "cpu";  // where the window runs (--backend: cpu, opencl[:P:D], cuda[:N])
  AttnType attn_type = AttnType::kF32;  // the window's attention operands (--attn-type)
  int n_ctx = 0;                        // KV capacity per session; 0 = the model's, capped at 4096
  wire::Dtype boundary = wire::Dtype::kF32;  // dtype of hidden states sent to the successor
  int chunk = 64;                            // head's prompt chunk: rows, and work (chunk_plan.h)
  int max_sessions = 64;
  // Prompt cache: the state of ended sessions kept for later ones whose prompt starts with the
  // same tokens, up to this many bytes (0: off) and for this long.
  uint64_t cache_bytes = uint64_t{256} << 20;
  int cache_ttl_ms = 300000;
  int max_batch_rows = 256;  // rows per Forward when batching sessions
  // Speculation (docs/PROTOCOL.md, "Speculation"), on the last stage only (others ignore it): it
  // drafts up to draft.max_tokens tokens after each token (prompt lookup, or the draft model
  // draft.model_path loaded by that stage), which the ring verifies in one traversal.
  spec::DraftOptions draft;

  // Trust (docs/PROTOCOL.md, "Handshake"). Every link runs the handshake and is encrypted.
  std::shared_ptr<const NodeKey> key;  // this node's identity; required
  std::string ring_secret;             // demanded of both neighbours when set
  std::optional<PublicKey> pred_key;   // the predecessor must be this node (manifest)
  std::optional<PublicKey> succ_key;   // the successor must be this node (manifest)
  std::string client_secret;           // head: demanded of clients when set
  // Neighbours without any proof; refused unless `listen` is a loopback address.
  bool insecure = false;

  // Liveness and limits (docs/PROTOCOL.md, "Limits").
  int link_timeout_ms = 10000;      // a silent neighbour or client is down after this long
  int handshake_timeout_ms = 5000;  // handshake and HELLO must complete within this
  // ... and within this while half the handshake slots are taken (a flood of connections).
  int pressure_handshake_timeout_ms = 1000;
  int max_pending = 64;             // connections still in their handshake
  int max_pending_per_address = 8;  // of them, from one address (an IPv6 /64 counts as one)
  int pending_reserved = 8;         // of them, kept for the addresses a predecessor came from
  int max_clients = 256;            // handshaken client connections (head)
  int max_sessions_per_client = 4;  // sessions one client connection may have at once
  // Bytes held for all clients together (records arriving, requests waiting, frames queued to
  // them); the clients that have held bytes the longest are dropped first to make room.
  size_t client_buffer_bytes = size_t{16} << 20;

  // Contribution receipts (docs/PROTOCOL.md, "RECEIPT"), on the head: when set, each session that
  // ran at least one row sends a receipt around the ring after its CLOSE_SESSION, every stage
  // signs its line onto it, and each receipt that comes back complete, for a session this head
  // started, with every signature verified, is handed here as its RECEIPT payload (the bytes
  // `kvasir join` posts to the market). Without it the head sends no receipts. Called on the
  // stage's compute thread, outside the stage's locks: return quickly (hand the payload to
  // another thread); the ring's sessions wait while it runs. An exception it throws is caught and
  // logged. Other stages ignore it: they sign every receipt that reaches them for a session that
  // closed there.
  std::function<void(std::vector<uint8_t> payload)> on_receipt;

  // Row commitments (docs/PROTOCOL.md, "Row commitments"): every stage signs in its receipt line
  // a Merkle root over the rows each session took in and gave out, and keeps the rows of the
  // sessions it signed here, within this store's budget, to reveal them when asked (`kvasir
  // join` answers the market's audits from it). Null: no rows are kept (the commitment is still
  // signed), as in a ring no market audits.
  std::shared_ptr<RowStore> row_store;

  // Test builds only (ring/test_fault.h): the probability that each row this stage sends on is
  // perturbed (and committed to as sent), for tests of the audits. Refused above 0 elsewhere.
  double test_fault_noise = 0;
};

// The checks of a stage's options that need no model (stage_check.cpp): addresses (--listen
// unless only a listening fd is given, --next unless a dial hook is set, --standby-peers),
// --chunk, --max-sessions, --max-clients, -t, --link-timeout, the handshake deadlines and slots,
// --repair-timeout, --standby on the head's window, --insecure off loopback, the test fault, and
// something to authenticate both neighbours with (a node key must already be set). Create() runs
// them; `kvasir stage` and `kvasir join` run them before anything is fetched, so a typo never
// costs a download. Errors name the flag and what is wrong.
Status CheckStageOptions(const StageOptions& opt);
// A stage's --boundary: "f32", "f16" or "bf16" (an error names the flag).
Status ParseBoundary(const std::string& text, wire::Dtype* dtype);

class Stage {
 public:
  // Loads the window (the head also the embeddings and tokenizer, the last stage the output head)
  // and binds the listen address. Refuses a window that is not inside the model.
  static Result<std::unique_ptr<Stage>> Create(const StageOptions& options);
  virtual ~Stage() = default;

  // The bound listen port (useful with port 0).
  virtual uint16_t port() const = 0;
  // Serves until Stop(). Returns an error only if the stage cannot continue.
  virtual Status Run() = 0;
  // Asks Run() to return; closes links and joins threads. Thread-safe.
  virtual void Stop() = 0;
  // Logs this stage's statistics (one line). Thread-safe.
  virtual void LogStats() = 0;
  // Whether the links to both neighbours are up now (handshake and HELLO done). Thread-safe.
  virtual bool linked() const = 0;
  // The standbys the market lists now (kvasir join): `next` of the successor's window, dialed in
  // turn after `next` and `standby_peers` and accepted with their keys; `pred` of the
  // predecessor's window, accepted as predecessors with theirs (one with `dial` is behind the
  // relay: its edge is kept dialed, as `dial_pred` is). Replaces the previous lists. Thread-safe.
  virtual void SetStandbys(std::vector<StandbyPeer> next, std::vector<StandbyPeer> pred) = 0;
  // Stops keeping the market's check edge (`dial_check`) dialed: the standby holds its window
  // now, and a holder is not checked. A dial waiting on the relay is cut. Idempotent; nothing
  // without `dial_check`. Thread-safe.
  virtual void StopCheckEdge() = 0;
  // Speculation on a last stage that drafts: its drafter and the drafts verified so far (zeros
  // and no drafter name elsewhere). Thread-safe.
  virtual DraftTotals draft_totals() const = 0;
};

}  // namespace kvasir::ring
