// A stage's part in contribution receipts (docs/PROTOCOL.md, "RECEIPT"), apart from its links and
// its model: the head starts a receipt when a session's CLOSE_SESSION went out and checks it when
// it comes back around; every other stage keeps the row count and commitment of each session that
// closed there until that session's receipt arrives, then appends its signed line. Sessions' rows
// go to the row store, found by the receipt id once signed. What a peer makes the book keep is
// bounded (kMaxRecent entries each). A receipt is accounting: a refused one is an error naming
// why, for the caller to log and drop. Not thread-safe: one owner (the stage's compute thread).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/model_id.h"
#include "ring/node_key.h"
#include "ring/receipt.h"
#include "ring/recent_map.h"
#include "ring/row_commit.h"
#include "ring/row_store.h"

namespace kvasir::ring {

struct ReceiptBookOptions {
  std::string name;                     // the stage, in log lines
  std::shared_ptr<const NodeKey> key;   // this node's identity, which signs its lines; required
  ModelId model_id{};                   // the model identity every receipt must name
  uint32_t first = 0, last = 0;         // this stage's window [first, last)
  uint32_t n_layer = 0;                 // the model's layers: where a complete receipt ends
  std::shared_ptr<RowStore> row_store;  // where closed sessions' rows go; required
};

class ReceiptBook {
 public:
  // Receipts and closed sessions each remembered at once (the oldest is forgotten).
  static constexpr size_t kMaxRecent = 1024;

  explicit ReceiptBook(ReceiptBookOptions options);

  // Head: session `session` ran `rows` rows committed in `commit` and its CLOSE went out. Returns
  // the RECEIPT payload with this head's line, to send around; the session's rows go to the store
  // under the new receipt's id, and the receipt waits to come back.
  std::vector<uint8_t> Start(uint32_t session, uint64_t rows, SessionRows commit);

  // Head, for a session whose client said it will vouch for the count (GENERATE with a receipt
  // id, docs/PROTOCOL.md, "Client counts"): the receipt waits for the client's count, under the
  // client's id, at most until `deadline` (Overdue's clock). At most kMaxAwaiting wait: beyond,
  // the oldest is started at once without a count, and returned to send.
  static constexpr size_t kMaxAwaiting = 256;
  std::optional<std::vector<uint8_t>> AwaitClient(uint32_t session, uint64_t client,
                                                  const std::array<uint8_t, 16>& id, uint64_t rows,
                                                  SessionRows commit, double deadline);
  // The client's count for `session` came (on the client's link `client`): the receipt, with the
  // count when its signature verifies for the receipt id, model and session (without it
  // otherwise), to send; nothing when no receipt of that client's session waits.
  std::optional<std::vector<uint8_t>> ClientVouched(uint32_t session, uint64_t client,
                                                    const wire::ClientCount& count);
  // The receipts whose client did not vouch by `now`, started without a count, to send.
  std::vector<std::vector<uint8_t>> Overdue(double now);

  // Not the head: session `session` closed here after `rows` rows committed in `commit`: the
  // count and root wait for its receipt, the rows go to the store.
  void Closed(uint32_t session, uint64_t rows, SessionRows commit);

  // Not the head: `payload` (a peer's RECEIPT, any bytes) with this stage's line appended, to
  // forward. Refused (and nothing signed) when it does not parse, names another model, has no
  // room for a line, does not end where this window starts, does not verify, or names a session
  // that did not close here (or too long ago); each session is signed at most once.
  Result<std::vector<uint8_t>> Sign(std::span<const uint8_t> payload);

  // Head: checks a RECEIPT that came back around, and returns it when it is complete: one this
  // head sent and not seen back before, every line verifies, the first is this head's, the lines
  // end at the model's last layer, and it names the session it was sent for.
  Result<Receipt> CameBack(std::span<const uint8_t> payload);

  // Receipts sent around and not back yet; closed sessions waiting for their receipt.
  size_t in_flight() const { return in_flight_.size(); }
  size_t closed() const { return closed_.size(); }
  RowStore& row_store() const { return *options_.row_store; }

 private:
  struct ClosedRows {
    uint64_t rows = 0;
    Digest root{};  // SessionRows::Root
  };
  struct AwaitingClient {
    uint32_t session = 0;
    uint64_t client = 0;
    std::array<uint8_t, 16> id{};
    uint64_t rows = 0;
    SessionRows commit;
    double deadline = 0;
  };
  std::vector<uint8_t> StartWith(uint32_t session, uint64_t rows, SessionRows commit,
                                 const std::array<uint8_t, 16>& id,
                                 std::optional<ClientCount> count);
  ReceiptBookOptions options_;
  std::deque<AwaitingClient> awaiting_;                                 // oldest first
  RecentMap<uint32_t, ClosedRows> closed_{kMaxRecent};                  // session -> its rows
  RecentMap<std::array<uint8_t, 16>, uint32_t> in_flight_{kMaxRecent};  // receipt id -> session
};

}  // namespace kvasir::ring
