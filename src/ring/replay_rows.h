// The boundary rows a stage sent on for each live session, kept for a replay (docs/PROTOCOL.md,
// "Repair"): when the ring is repaired, a stage that still holds a session's state sends these
// rows on again instead of recomputing them, so that only the positions a stage lacks are
// computed. Bounded by a byte budget; a session whose rows do not all fit is not kept at all (a
// replay then recomputes it on this stage). Pure; compute thread only (not thread-safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "ring/messages.h"
#include "ring/wire.h"

namespace kvasir::ring {

// What replays did on one stage, for its statistics.
struct ReplayCounts {
  uint64_t kept = 0;        // replayed positions this stage did not run again
  uint64_t recomputed = 0;  // replayed positions this stage ran again
  // Head: replayed sessions whose client got a token again, and the pauses they saw.
  uint64_t pauses = 0;
  uint64_t pause_ms_total = 0;
  uint64_t pause_ms_max = 0;
  void AddPause(uint64_t ms) {
    ++pauses;
    pause_ms_total += ms;
    if (ms > pause_ms_max) pause_ms_max = ms;
  }
};

class ReplayRows {
 public:
  // `max_bytes`: the rows of all sessions together (their buffers' capacity); 0 keeps nothing.
  explicit ReplayRows(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Keeps the rows of `h`, as sent (its dtype), after the session's kept rows, which always run
  // from position 0 without a gap. A message that starts before the kept end (rejected drafts
  // rolled back, a replay) first drops the kept rows from its pos0 on; one that starts past the
  // end (a session forked from the prompt cache, or one dropped for the budget) is not kept.
  // When the budget is exceeded, whole sessions are dropped, the largest (then the least
  // recently added to) first, `h`'s own last; `h`'s session alone when it alone exceeds it.
  void Add(const HiddenMsg& h);
  // How many rows are kept for `session`, from position 0.
  uint32_t kept(uint32_t session) const;
  // Keeps only the first `n` rows of `session`.
  void Truncate(uint32_t session, uint32_t n);
  // A HIDDEN with the kept rows [pos0, pos0 + n) of `session` and `flags`, bit-exact as they were
  // sent. Requires pos0 + n <= kept(session) and n > 0.
  HiddenMsg Rows(uint32_t session, uint32_t pos0, uint32_t n, uint16_t flags) const;
  void Drop(uint32_t session);
  // Drops every session for which `live` returns false.
  void Retain(const std::function<bool(uint32_t)>& live);

  size_t bytes() const { return bytes_; }
  size_t sessions() const { return kept_.size(); }
  size_t max_bytes() const { return max_bytes_; }
  // Sessions dropped so far because their rows did not fit in the budget.
  uint64_t evicted() const { return evicted_; }

 private:
  struct Kept {
    wire::Dtype dtype = wire::Dtype::kF32;
    uint32_t n_embd = 0;
    uint32_t n = 0;             // rows kept
    size_t row_bytes = 0;       // bytes per row in dtype
    std::vector<uint8_t> data;  // [n, n_embd] row-major, dtype
    uint64_t last_add = 0;
  };
  void Account(Kept& k, size_t old_capacity);
  void Evict(uint32_t keep_last);

  size_t max_bytes_;
  size_t bytes_ = 0;
  uint64_t tick_ = 0;
  uint64_t evicted_ = 0;
  std::map<uint32_t, Kept> kept_;
};

}  // namespace kvasir::ring
