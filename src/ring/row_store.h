// The boundary rows of recent sessions, kept so that a stage can reveal some positions of a
// session it signed a receipt for (docs/PROTOCOL.md, "Row commitments"; docs/MARKET.md,
// "Audits"). SessionRows gathers one session's positions as they run (leaf hashes into the
// Merkle tree at once, the rows kept while the store has room for them); RowStore holds the
// closed sessions within a byte and an age budget, oldest first out. The budget covers the rows
// of open sessions too: whatever peers send, the rows kept stay within it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "base/status.h"
#include "ring/row_commit.h"

namespace kvasir::ring {

using ReceiptId = std::array<uint8_t, 16>;

class RowStore;

// One session's positions in the order its window ran them. Not thread-safe.
class SessionRows {
 public:
  // Keeps the rows (and leaves) within `store`'s budget, reserved there as they come; when the
  // store has no room, every row of the session is dropped and only the tree goes on (32 bytes
  // held whatever the length). Null: the tree only.
  explicit SessionRows(std::shared_ptr<RowStore> store = nullptr);
  ~SessionRows();
  SessionRows(SessionRows&& other) noexcept;
  SessionRows& operator=(SessionRows&& other) noexcept;

  void Add(PositionRows rows);
  uint64_t size() const { return tree_.size(); }
  // The commitment a receipt line signs: the Merkle root of the leaves; zero for no positions.
  Digest Root() const;
  // The bytes its kept rows and leaves hold (reserved in the store).
  size_t bytes() const { return bytes_; }
  // Whether every position's rows are kept.
  bool kept() const { return store_ != nullptr; }

 private:
  friend class RowStore;
  void Drop();  // gives up the rows and their reservation
  std::shared_ptr<RowStore> store_;
  MerkleBuilder tree_;
  std::vector<Digest> leaves_;
  std::vector<PositionRows> rows_;
  size_t bytes_ = 0;
};

struct RowStoreOptions {
  size_t max_bytes = size_t{256} << 20;  // rows of all kept sessions together; 0 keeps none
  double max_age_s = 600;                // a session is forgotten this long after it closed
};

// At most this many positions are revealed at once.
inline constexpr size_t kMaxRevealPositions = 64;

struct RevealedPosition {
  uint64_t index = 0;  // the leaf: the index-th position the window ran
  PositionRows rows;
  std::vector<Digest> path;  // MerklePath of the leaf
};

struct RowReveal {
  uint64_t n = 0;  // positions in the session (the tree's leaves; the receipt's token count)
  Digest root{};
  std::vector<RevealedPosition> positions;
};

class RowStore {
 public:
  // `now`: seconds on a steady clock (tests pass their own).
  explicit RowStore(RowStoreOptions options, std::function<double()> now = {});

  const RowStoreOptions& options() const { return options_; }
  // Whether sessions should keep their rows at all (a budget of 0 bytes keeps none).
  bool keeps_rows() const { return options_.max_bytes > 0; }

  // Room for `bytes` more of an open session's rows: closed sessions are forgotten, the oldest
  // first, to make it. False when the open sessions alone would pass the budget. Thread-safe.
  bool Reserve(size_t bytes);
  void Release(size_t bytes);

  // A session that closed here: kept (its reservation becomes the store's) unless it did not
  // keep all its rows. Sessions past the age budget are forgotten. Thread-safe.
  void Put(uint32_t session, SessionRows rows);
  // This stage signed `root` for `session` in receipt `id`: the session's rows are found by the
  // id from now on. Nothing happens when they are not here (any more). Thread-safe.
  void Bind(uint32_t session, const Digest& root, const ReceiptId& id);
  // The rows, leaves and paths of positions `indices` of the session signed in receipt `id`.
  // Errors: kNotFound when the session is not kept (never here, forgotten, or not signed), and
  // kInvalidInput for an index past its positions or more than kMaxRevealPositions. Thread-safe.
  Result<RowReveal> Reveal(const ReceiptId& id, std::span<const uint64_t> indices);

  // Bytes held: of closed sessions, and reserved by open ones.
  size_t bytes() const;
  size_t open_bytes() const;
  size_t sessions() const;

 private:
  struct Entry {
    uint32_t session = 0;
    bool bound = false;
    ReceiptId id{};
    Digest root{};
    double closed_at = 0;
    SessionRows rows;
  };
  void TrimLocked(double now);

  RowStoreOptions options_;
  std::function<double()> now_;
  mutable std::mutex mu_;
  std::deque<Entry> entries_;  // oldest first
  size_t bytes_ = 0;           // of entries_
  size_t open_bytes_ = 0;      // reserved by open sessions
};

// Checks a reveal against the commitment of a receipt line: `n` positions (its token count)
// with Merkle root `root`, every revealed position's leaf on its path to that root, and each
// index at most once and below n. The error names the first position that fails. Pure.
Status CheckReveal(const RowReveal& reveal, const Digest& root, uint64_t n);

}  // namespace kvasir::ring
