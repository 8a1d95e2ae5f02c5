// A client of a ring: connects to the head stage, sends GENERATE, and receives the tokens as the
// ring produces them. Used by `kvasir generate --ring` and `kvasir run`.
#pragma once

#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "ring/handshake.h"
#include "ring/link.h"
#include "ring/messages.h"
#include "ring/node_key.h"

namespace kvasir::ring {

struct GenerateResult {
  int n_prompt = 0;
  int n_cached = 0;  // prompt tokens the prompt cache served (when GENERATE asked for the count)
  int n_generated = 0;
  wire::FinishReason reason = wire::FinishReason::kNone;
  double ttft_ms = 0;   // request sent -> first token received
  double total_ms = 0;  // request sent -> last token received
  // With ClientOptions::client_key: the session's receipt id and the count the client signed
  // (the prompt's tokens and those received, less the last, which no stage ran).
  std::optional<std::array<uint8_t, 16>> receipt_id;
  uint64_t vouched = 0;
};

// How a client reaches and trusts a head.
struct ClientOptions {
  int connect_timeout_ms = 30000;  // keep dialing a head that is not up yet for this long
  // The head is authenticated by one of these before any prompt is sent.
  std::optional<PublicKey> head_key;  // the head must sign with exactly this node key
  std::string ring_secret;            // the head must prove the ring secret
  bool insecure = false;              // no proof (loopback heads only)
  std::string client_secret;          // a bearer secret the head may demand of clients
  int link_timeout_ms = 10000;        // the head is down after this long without a byte
  // A generation fails when the ring sends no token (or other answer) for this long.
  int token_timeout_ms = 60000;
  // With a key, the client vouches for the count of each session it ran (docs/PROTOCOL.md,
  // "Client counts"): it picks the session's receipt id, and signs the count with its CLOSE.
  std::shared_ptr<const NodeKey> client_key;
};

class RingClient {
 public:
  // Connects to the head at HOST:PORT, runs the handshake (authenticating the head as `options`
  // say) and exchanges HELLO, retrying while the head is not reachable yet. A head that fails
  // authentication is not retried.
  static Result<std::unique_ptr<RingClient>> Connect(const std::string& head,
                                                     const ClientOptions& options);
  // With a ring secret only: the common case of tests and `kvasir run`.
  static Result<std::unique_ptr<RingClient>> Connect(const std::string& head, int timeout_ms,
                                                     const std::string& ring_secret);

  const wire::Hello& head_hello() const { return head_hello_; }

  // Runs one generation. `on_token` gets each token with its text piece as it arrives.
  Result<GenerateResult> Generate(const GenerateMsg& request,
                                  const std::function<void(const TokenMsg&)>& on_token);
  // The same, and the caller may end the session early: when `on_token` returns false, or at the
  // first message after `*cancel` turned true (another thread may set it), the client sends
  // CLOSE_SESSION (the head ends the session, which frees it on every stage), waits until the
  // head has taken it (a PING answered behind it, so no token of the session is left on the
  // link), and returns with reason kClientClosed. A refusal or failure from the ring comes back
  // with a code: kInvalidInput (a request the ring refused: the prompt over the context, a value
  // out of range), kTooLarge, kConflict (the head is busy: too many sessions), kUnavailable (a
  // link of the ring is down), kTimeout (no token within token_timeout_ms).
  Result<GenerateResult> Generate(const GenerateMsg& request,
                                  const std::function<bool(const TokenMsg&)>& on_token,
                                  const std::atomic<bool>* cancel);
  // Waits until the head reports a closed ring (its probe went all the way around), or the
  // timeout passes.
  Status WaitReady(int timeout_ms);
  // Collects one statistics record per stage, in ring order from the head.
  Result<std::vector<wire::StageStats>> Stats();
  // The same with the drafting counts of stages that draft (StatsMsg::drafts: empty when none).
  Result<StatsMsg> StatsMessage();
  // Whether the link still works (a client whose link failed must be dropped).
  bool usable() const { return !link_->closed(); }
  // Closes the link at once, from any thread: a Generate in progress returns an error, and the
  // head ends the client's sessions on every stage.
  void Abort() { link_->Close(); }

 private:
  RingClient(std::unique_ptr<Link> link, ClientOptions options)
      : link_(std::move(link)), options_(std::move(options)) {}
  // Ends `session` (CLOSE_SESSION) and waits for the head to have taken it.
  // `close`: the CLOSE_SESSION to send (with the client's count), else a plain one.
  Status EndSession(uint32_t session, std::optional<CloseMsg> close = std::nullopt);
  // With a client key: the CLOSE_SESSION that carries the session's signed count.
  std::optional<CloseMsg> Vouch(uint32_t session, wire::FinishReason reason, int n_prompt,
                                int received, GenerateResult* r);
  bool Ended(uint32_t session) const;
  void NoteEnded(uint32_t session);

  std::unique_ptr<Link> link_;
  ClientOptions options_;
  wire::Hello head_hello_{};
  // Sessions of this link that ended (finished or closed): a late message of theirs (an ERROR the
  // ring sent around before it saw the CLOSE) is not taken for the next request's.
  std::deque<uint32_t> ended_;
  uint64_t next_nonce_ = 1;
};

}  // namespace kvasir::ring
