// The side of a stage that others dial: its predecessor in the ring and, on the head, clients.
// PredecessorSide accepts connections through the handshake slots (ring/pending_table.h), runs
// the handshake as the responder (ring/handshake.h) and HELLO within a deadline, and serves each
// link on its own thread: one predecessor at a time (a newer one, by HELLO's generation, takes
// the place of the one linked; an older one is refused while the newer one is linked), and up to
// max_clients clients, whose buffers are charged to the client budget (ring/byte_budget.h). With
// a dial hook it also keeps a relayed predecessor dialed, a standby's check edge, and an edge to
// each relayed standby of the predecessor's window (SetStandbys). It knows nothing of sessions: it
// tells its owner by events (predecessor up/down, client joined/left, a message) and takes what it
// needs through PredecessorSideOptions. Limits: docs/PROTOCOL.md, "Limits". Thread-safe; the
// callbacks run on the connection threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/watchdog.h"
#include "net/stream.h"
#include "ring/byte_budget.h"
#include "ring/handshake.h"
#include "ring/link.h"
#include "ring/link_set.h"
#include "ring/messages.h"
#include "ring/pending_table.h"
#include "ring/repair.h"
#include "ring/stage.h"
#include "ring/wire.h"

namespace kvasir::ring {

// A message read from the predecessor (`from_pred`) or from client `client`.
struct PeerMessage {
  bool from_pred = false;
  uint64_t client = 0;
  Message msg;
  ByteCharge charge;  // a client's message: its bytes, held until the owner is done with it
};

struct PredecessorSideOptions {
  std::string name;                          // the stage, in log lines
  int handshake_timeout_ms = 10000;          // handshake and HELLO together
  int pressure_handshake_timeout_ms = 2000;  // the same while the slots are under pressure
  int max_pending = 64;                      // handshake slots (PendingTable::Limits)
  int max_pending_per_address = 8;
  int pending_reserved = 8;
  LinkAuth stage_auth;              // this stage's proofs, the predecessor's key when required
  LinkAuth client_auth;             // the client secret, when clients must prove one
  uint32_t stage_max_payload = 0;   // the largest frame payload from a predecessor
  uint32_t client_max_payload = 0;  // ... and from a client
  LinkOptions stage_link;           // an accepted predecessor link's (timeout, queue)
  int link_timeout_ms = 10000;      // a client link's silence limit
  // Clients: whether this stage takes them (the head), and why not otherwise.
  bool accepts_clients = false;
  std::string clients_refusal;
  int max_clients = 64;
  size_t client_buffer_bytes = size_t{64} << 20;  // the client budget
  size_t message_overhead = 0;  // what a client's message held by the owner costs besides its bytes
  // A relayed predecessor: dialed (and redialed) instead of accepted; accepted ones are refused.
  DialHook dial_pred;
  std::string pred_via;  // what dial_pred reaches, in messages
  // A relayed edge kept dialed besides dial_pred's (a standby's check edge): each connection is
  // served as one accepted from the listener would be (the market's check is a client's
  // handshake), so the stage answers on it even while its predecessor holds their edge.
  DialHook dial_check;
  // This stage's HELLO, asked for each link as it answers.
  std::function<wire::Hello()> hello;
  // Checks a predecessor's HELLO (model, adjacency); an error refuses the link with ERROR *code.
  std::function<Status(const wire::Hello&, wire::ErrorCode* code)> check_hello;
  // A predecessor passed every check, just before this side answers its HELLO.
  std::function<void()> on_pred_admitted;
  // Events. A predecessor that replaces another is told as down (the old one, with why) then up.
  std::function<void(const wire::Hello& peer, const std::string& what)> on_pred_up;
  std::function<void(const std::string& reason)> on_pred_down;
  std::function<void(uint64_t client)> on_client_joined;
  std::function<void(uint64_t client)> on_client_left;
  // A message from a linked peer; a predecessor's are told only while it holds the place, so
  // none of a replaced one's comes after its down event.
  std::function<void(PeerMessage m)> on_message;
  // A connection refused, or cut in its handshake.
  std::function<void()> on_refused;
};

class PredecessorSide {
 public:
  PredecessorSide(PredecessorSideOptions options, net::Listener listener);
  ~PredecessorSide();
  PredecessorSide(const PredecessorSide&) = delete;
  PredecessorSide& operator=(const PredecessorSide&) = delete;

  uint16_t port() const { return listener_.port(); }
  // Starts accepting (and dialing the relayed predecessor). Nothing happens after Stop().
  void Start();
  // Stops accepting and dialing, closes every link and waits for every connection thread.
  // No event is told once it returns. Idempotent.
  void Stop();

  // The neighbour's standbys the market lists for the predecessor's window: their keys are
  // accepted as the predecessor's, and the relayed ones are kept dialed while listed.
  void SetStandbys(const std::vector<StandbyPeer>& pred);
  // Stops dialing the check edge (options `dial_check`), a dial in progress cut. Idempotent.
  void StopCheckEdge() { check_retired_->store(true); }
  // Sends to client `client`; a client that is gone or cannot take it is dropped (never waits).
  void SendToClient(uint64_t client, const Message& m);

  bool pred_up() const;
  size_t clients() const;
  uint64_t pred_bytes_in() const { return pred_bytes_in_.load(); }
  uint64_t newest_pred_generation() const { return gate_.newest(); }

 private:
  struct PendingConn;  // an accepted connection still in its handshake
  // A relayed predecessor standby's edge, kept dialed (served as an accepted predecessor) until
  // the standby leaves the market's list (`retired`) or the side stops.
  struct StandbyDialer {
    std::string via;
    std::shared_ptr<std::atomic<bool>> retired;
    std::thread thread;
  };

  void AcceptLoop();
  // Handshake, HELLO, then the link is served until it ends. An error when it ended before the
  // HELLO exchange completed. `pending`: its handshake slot; null for a dialed predecessor.
  Status ServeConnection(std::unique_ptr<net::Stream> raw, std::shared_ptr<PendingConn> pending);
  Result<std::shared_ptr<Link>> AcceptLink(std::unique_ptr<net::Stream> raw, PendingConn* pending,
                                           wire::Hello* peer_hello, bool* is_client,
                                           std::shared_ptr<ByteAccount>* account);
  Status CheckPredecessor(const wire::Hello& h, bool via_relay, wire::ErrorCode* code);
  void ServeLink(std::shared_ptr<Link> link, const wire::Hello& h, bool is_client,
                 const std::shared_ptr<ByteAccount>& account);
  // Under threads_mu_: cuts handshake `id` (and forgets it), or every one still pending.
  void CutPending(uint64_t id, const std::string& why);
  void CutAllPending(const std::string& why);
  // On the watchdog: cuts the handshakes whose deadline passed.
  void Housekeeping();
  // Once a second after connections ended, gives the memory they freed back to the system.
  void TrimLoop();
  // predecessor_dialers.cpp: the relayed predecessor and the relayed standbys.
  void PredDialLoop();
  // Keeps `dial`'s edge dialed, serving each connection, until `retired` or Stop().
  void StandbyDialLoop(DialHook dial, std::shared_ptr<std::atomic<bool>> retired);
  void JoinStandbyDialers();
  void Backoff(int* backoff_ms);
  bool AcceptsStandby(const PublicKey& key);
  bool Track(const std::shared_ptr<Link>& link);
  void Refused(const std::string& peer, const Status& why);

  PredecessorSideOptions options_;
  net::Listener listener_;
  std::atomic<bool> running_{true};
  std::mutex stop_mu_;
  bool started_ = false;  // guarded by stop_mu_
  std::thread accept_thread_, trim_thread_, pred_thread_, check_thread_;
  const std::shared_ptr<std::atomic<bool>> check_retired_ = std::make_shared<std::atomic<bool>>();
  Watchdog::Id watch_ = 0;

  // Connection threads are detached; Stop() waits for them. Guarded by threads_mu_, with the
  // pending table.
  std::mutex threads_mu_;
  std::condition_variable conns_cv_;
  int live_conns_ = 0;
  LinkSet links_;  // the links Stop() closes
  PendingTable pending_;
  std::map<uint64_t, std::shared_ptr<PendingConn>> pending_conns_;
  std::atomic<uint64_t> conns_ended_{0};  // for TrimLoop()
  std::mutex trim_mu_;
  std::condition_variable trim_cv_;
  std::shared_ptr<ByteBudget> client_budget_;

  // The links, guarded by links_mu_.
  mutable std::mutex links_mu_;
  std::shared_ptr<Link> pred_;
  std::map<uint64_t, std::shared_ptr<Link>> clients_;
  uint64_t next_client_ = 1;
  GenerationGate gate_;
  std::atomic<uint64_t> pred_bytes_in_{0};

  std::mutex standby_mu_;
  std::vector<PublicKey> standby_keys_;  // guarded by standby_mu_
  std::vector<StandbyDialer> dialers_;   // guarded by standby_mu_
  std::mutex backoff_mu_;                // wakes the dialers' backoff on Stop()
  std::condition_variable backoff_cv_;
};

}  // namespace kvasir::ring
