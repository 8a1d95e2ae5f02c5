#include "ring/prompt_cache.h"

#include <algorithm>

namespace kvasir::ring {

std::vector<uint32_t> PromptCache::Put(Entry e) {
  std::vector<uint32_t> evicted;
  Take(e.session);  // the same sequence, kept again
  if (e.bytes > budget_) {
    evicted.push_back(e.session);
    return evicted;
  }
  bytes_ += e.bytes;
  by_session_[e.session] = entries_.insert(entries_.end(), std::move(e));
  while (bytes_ > budget_) {
    evicted.push_back(*EvictOldest());
  }
  return evicted;
}

std::optional<PromptCache::Entry> PromptCache::Take(uint32_t session) {
  auto it = by_session_.find(session);
  if (it == by_session_.end()) return std::nullopt;
  Entry e = std::move(*it->second);
  entries_.erase(it->second);
  by_session_.erase(it);
  bytes_ -= e.bytes;
  return e;
}

std::optional<PromptCache::Match> PromptCache::Best(std::span<const int32_t> ids, bool exact_only,
                                                    int min_keep) const {
  std::optional<Match> best;
  const int limit = static_cast<int>(ids.size()) - 1;
  for (const Entry& e : entries_) {
    const size_t n = std::min({e.tokens.size(), ids.size(), static_cast<size_t>(e.length)});
    const auto [a, b] = std::mismatch(e.tokens.begin(), e.tokens.begin() + n, ids.begin());
    int common = static_cast<int>(a - e.tokens.begin());
    if (exact_only && (common != e.length || common != static_cast<int>(e.tokens.size()))) {
      continue;
    }
    common = std::min(common, limit);
    if (exact_only && common != e.length) continue;
    if (common < min_keep) continue;
    // Taking an entry over consumes it: a prompt that would keep less than half of the entry's
    // prompt (a short prompt sharing a long chat's first template tokens) opens afresh and
    // leaves the entry for the chat's next turn.
    const int prompt = e.n_prompt > 0 ? std::min(e.n_prompt, e.length) : e.length;
    if (2 * common < prompt) continue;
    if (!best || common > best->n_keep) best = Match{e.session, common};
  }
  return best;
}

std::vector<uint32_t> PromptCache::Expire(Clock::time_point now) {
  std::vector<uint32_t> expired;
  while (!entries_.empty() && now - entries_.front().last > ttl_) {
    expired.push_back(*EvictOldest());
  }
  return expired;
}

std::optional<uint32_t> PromptCache::EvictOldest() {
  if (entries_.empty()) return std::nullopt;
  const uint32_t session = entries_.front().session;
  Take(session);
  return session;
}

}  // namespace kvasir::ring
