// Stage runtime, repair (docs/PROTOCOL.md, "Repair"). When a link of the ring goes down, the
// stages on both sides, and every stage the news reaches, hold their sessions instead of failing
// them, for up to the repair timeout (HoldBook). The successor link redials, through the standby
// peers when the successor is gone; once the head's probe comes back around, the head replays
// every held session: OPEN_SESSION with kOpenReplay and the session's ids (prompt, then the tokens
// sampled so far), then its kept rows and the ids it lacks as prompt chunks. Every stage runs
// only the positions it lacks (stage_replay.cpp), so a replacement that holds nothing and a stage
// that holds everything end with the same state, and the last stage resumes the sampler after the
// tokens it had drawn: the client gets exactly the tokens an undisturbed run gives. Sessions not
// replayed in time end with an error, on every stage. The head's part (the replay it sends, the
// tokens it accepts after it) is its role's: head_replay.cpp.
#include <fmt/format.h>

#include "base/log.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {

void StageImpl::RingBroken(const std::string& why, bool forward) {
  if (!holds_.enabled()) {
    FailAll(why, forward);
    return;
  }
  std::vector<uint32_t> ids;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (!entry_->Holds(it->second)) {
      it = sessions_.erase(it);
      continue;
    }
    ids.push_back(it->first);
    ++it;
  }
  holds_.Hold(ids, Clock::now());
  hold_reason_ = why;
  if (!ids.empty()) {
    KV_LOG_WARN("{}: holding {} session(s) for up to {:.1f} s: {}", options_.name, ids.size(),
                holds_.timeout().count() / 1000.0, why);
  }
  entry_->OnRingDown(why, forward);
}

void StageImpl::ExpireHolds() {
  if (holds_.empty()) return;
  for (uint32_t id : holds_.Expired(Clock::now())) {
    EndHeld(id, fmt::format("session ended: the ring was not repaired within {:.1f} s ({})",
                            holds_.timeout().count() / 1000.0, hold_reason_));
  }
}

bool StageImpl::EndOldestHeld() {
  const std::optional<uint32_t> id = holds_.Oldest();
  if (!id) return false;
  holds_.Release(*id);
  EndHeld(*id, fmt::format("session ended: a new session needed its place while the ring was "
                           "being repaired ({})",
                           hold_reason_));
  return true;
}

void StageImpl::EndHeld(uint32_t id, const std::string& why) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  KV_LOG_WARN("{}: session {}: {}", options_.name, id, why);
  window_->CloseSequence(static_cast<int>(id));
  scheduler_.TakeSession(id);
  entry_->OnHeldEnded(it->second, why);
  sessions_.erase(it);
}

void StageImpl::ResetForReplay(uint32_t session) {
  holds_.Release(session);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;  // a replacement: it never had the session
  window_->CloseSequence(static_cast<int>(session));
  scheduler_.TakeSession(session);
  sessions_.erase(it);
}

void StageImpl::MaybeStartDialing() {
  if (!options_.standby || !adopted_.load()) return;
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (!running_.load() || dial_thread_.joinable()) return;
  {
    // Made again so that its HELLO carries the generation of the adoption.
    std::lock_guard<std::mutex> lock(links_mu_);
    succ_link_ = std::make_unique<SuccessorLink>(SuccessorOptions());
  }
  // It takes the place of a stage that died: its successor may have died too, so every address.
  succ_linked_once_.store(true);
  KV_LOG_INFO("{}: adopted by a predecessor: dialing the successor", options_.name);
  dial_thread_ = std::thread([this] { succ_link_->Run(); });
}

void StageImpl::CheckStalled(Clock::time_point last_turn) {
  const auto gap = Clock::now() - last_turn;
  if (gap < std::chrono::milliseconds(options_.link_timeout_ms)) return;
  // Frozen (SIGSTOP, a suspended machine) for longer than a link may be silent: a standby has
  // probably taken this place. Its standbys are not this stage's to adopt; only `next` is
  // dialed until a successor links again, and a neighbour that moved on refuses this process.
  if (succ_linked_once_.exchange(false)) {
    KV_LOG_WARN(
        "{}: this process did not run for {:.1f} s: dialing only {} until a successor "
        "links again",
        options_.name, std::chrono::duration<double>(gap).count(), succ_desc_);
  }
}

}  // namespace kvasir::ring
