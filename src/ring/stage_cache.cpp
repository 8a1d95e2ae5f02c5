// The stage's prompt cache (ring/prompt_cache.h): keeping ended sessions, taking them over, and
// the head's fallback when a stage has not kept what it asked for.
#include "base/log.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {

Status StageImpl::OpenSequence(uint32_t session) {
  Status s = window_->OpenSequence(static_cast<int>(session));
  // A kept session holds a sequence of the window: the oldest ones make room for live sessions.
  while (!s.ok() && cache_.size() > 0) {
    window_->CloseSequence(static_cast<int>(*cache_.EvictOldest()));
    s = window_->OpenSequence(static_cast<int>(session));
  }
  // Then sessions held for a repair: a ring member that replaces its predecessor again and again
  // would otherwise fill the window with held sessions until their timeout.
  while (!s.ok() && EndOldestHeld()) s = window_->OpenSequence(static_cast<int>(session));
  return s;
}

bool StageImpl::ForkSequence(uint32_t from, uint32_t to, int n_keep) {
  ExpireCache();
  auto kept = cache_.Take(from);
  if (!kept) return false;
  if (kept->length < n_keep ||
      !window_->RenameSequence(static_cast<int>(from), static_cast<int>(to)).ok()) {
    window_->CloseSequence(static_cast<int>(from));
    return false;
  }
  if (Status st = window_->TruncateSequence(static_cast<int>(to), n_keep); !st.ok()) {
    KV_LOG_DEBUG("{}: session {}: cannot keep {} positions of session {}: {}", options_.name, to,
                 n_keep, from, st.message());
    window_->CloseSequence(static_cast<int>(to));
    return false;
  }
  return true;
}

void StageImpl::KeepOrClose(Session& s, wire::FinishReason reason) {
  const int seq = static_cast<int>(s.id);
  if (s.keep && reason != wire::FinishReason::kError) DropUnverifiedRows(s);
  const int length = window_->SequenceLength(seq);
  if (!s.keep || reason == wire::FinishReason::kError || length <= 0) {
    window_->CloseSequence(seq);
    return;
  }
  PromptCache::Entry e;
  e.session = s.id;
  e.length = length;
  e.bytes = window_->SequenceBytes(seq);
  e.last = PromptCache::Clock::now();
  entry_->OnKept(s, e);  // the head keeps the ids
  for (uint32_t evicted : cache_.Put(std::move(e)))
    window_->CloseSequence(static_cast<int>(evicted));
}

void StageImpl::ExpireCache() {
  for (uint32_t expired : cache_.Expire(PromptCache::Clock::now())) {
    window_->CloseSequence(static_cast<int>(expired));
  }
}

}  // namespace kvasir::ring
