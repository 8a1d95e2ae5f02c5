// The sessions a stage keeps after they end, so that a later session whose prompt starts with the
// same tokens takes their state over (attention KV of the common prefix, recurrent states at their
// exact end) instead of running those positions again through every stage. Bounded by bytes and by
// age; the oldest entry goes first. The head also remembers each entry's tokens and picks the
// entry a new prompt extends best; every stage keeps entries by session id, as the head tells it
// (docs/PROTOCOL.md, "Prompt cache"). Not thread-safe: the stage's compute loop owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace kvasir::ring {

class PromptCache {
 public:
  using Clock = std::chrono::steady_clock;

  struct Entry {
    uint32_t session = 0;
    int length = 0;               // positions its state holds
    uint64_t bytes = 0;           // what its state costs
    std::vector<int32_t> tokens;  // the head's: the ids of those positions
    int n_prompt = 0;             // the head's: how many of them were the session's prompt
    Clock::time_point last{};     // when it was kept
  };
  // Where a new prompt may start: the entry to take over and how many of its positions to keep.
  struct Match {
    uint32_t session = 0;
    int n_keep = 0;
  };

  PromptCache(uint64_t budget_bytes, std::chrono::milliseconds ttl)
      : budget_(budget_bytes), ttl_(ttl) {}

  // Keeps `e` (replacing an entry of the same session), then evicts the oldest entries until the
  // bytes fit the budget. Returns the sessions evicted, for the caller to free: `e.session`
  // itself when it alone exceeds the budget.
  std::vector<uint32_t> Put(Entry e);
  // Takes the entry of `session` out (a new session takes its state over); nullopt when absent.
  std::optional<Entry> Take(uint32_t session);
  // The entry whose tokens share the longest prefix with `ids`, keeping at most ids.size() - 1
  // positions (the last prompt token must run to be sampled from), at least `min_keep` and at
  // least half of the entry's prompt (taking an entry consumes it). With
  // `exact_only` (a window with recurrent state, which cannot be cut) only an entry whose tokens
  // are all a prefix of `ids` matches, keeping all of them.
  std::optional<Match> Best(std::span<const int32_t> ids, bool exact_only, int min_keep = 1) const;
  // The entries kept longer than the ttl at `now`: removed, for the caller to free.
  std::vector<uint32_t> Expire(Clock::time_point now);
  // The oldest entry, removed (to free its sequence for a new session); nullopt when empty.
  std::optional<uint32_t> EvictOldest();

  size_t size() const { return entries_.size(); }
  uint64_t bytes() const { return bytes_; }
  uint64_t budget() const { return budget_; }

 private:
  uint64_t budget_;
  std::chrono::milliseconds ttl_;
  uint64_t bytes_ = 0;
  std::list<Entry> entries_;  // oldest first
  std::unordered_map<uint32_t, std::list<Entry>::iterator> by_session_;
};

}  // namespace kvasir::ring
