// Stage runtime, repair (docs/PROTOCOL.md, "Repair"). When a link of the ring goes down, the
// stages on both sides, and every stage the news reaches, hold their sessions instead of failing
// them, for up to the repair timeout (HoldBook). The successor link redials, through the standby
// peers when the successor is gone; once the head's probe comes back around, the head replays
// every held session: OPEN_SESSION with kOpenReplay and the session's ids (prompt, then the tokens
// sampled so far), then its kept rows and the ids it lacks as prompt chunks. Every stage runs
// only the positions it lacks (stage_replay.cpp), so a replacement that holds nothing and a stage
// that holds everything end with the same state, and the last stage resumes the sampler after the
// tokens it had drawn: the client gets exactly the tokens an undisturbed run gives. Sessions not
// replayed in time end with an error, on every stage.
#include <fmt/format.h>

#include "base/log.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {
namespace {

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

void StageImpl::RingBroken(const std::string& why, bool forward) {
  if (!holds_.enabled()) {
    FailAll(why, forward);
    return;
  }
  std::vector<uint32_t> ids;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    Session& s = it->second;
    if (s.originated && s.closing && !holds_.held(s.id)) {
      // Its CLOSE may be lost at the break; every other stage holds it and lets it expire.
      it = sessions_.erase(it);
      continue;
    }
    ids.push_back(s.id);
    entry_->OnHeld(s.id);
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
  Session& s = it->second;
  KV_LOG_WARN("{}: session {}: {}", options_.name, id, why);
  window_->CloseSequence(static_cast<int>(id));
  scheduler_.TakeSession(id);
  if (s.originated) {
    if (!s.closing) SendToClient(s.client, ErrorMsg{wire::ErrorCode::kLinkDown, id, why});
    // The stages before the break free it now; the others hold it and expire it too.
    SendNext(CloseMsg{id, static_cast<uint8_t>(wire::FinishReason::kError)});
  }
  sessions_.erase(it);
}

void StageImpl::ReplayHeld() {
  for (uint32_t id : holds_.ids()) {
    const auto since = holds_.since(id);
    holds_.Release(id);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) continue;
    Session& s = it->second;
    if (s.closing) {
      // Ended while held: its CLOSE may have died at the break; send it around the whole ring.
      if (!SendNext(CloseMsg{id, static_cast<uint8_t>(wire::FinishReason::kClientClosed)})) {
        continue;
      }
      sessions_.erase(it);
      continue;
    }
    scheduler_.TakeSession(id);
    const int n = static_cast<int>(s.history.size());
    // What this window still holds is kept, and its rows are sent on again (stage_replay.cpp);
    // without them, everything again from position 0.
    const int skip = KeepForReplay(s, n);
    if (skip == 0) {
      replay_rows_.Drop(id);
      window_->CloseSequence(static_cast<int>(id));
      if (Status st = OpenSequence(id); !st.ok()) {
        KV_LOG_WARN("{}: session {}: replay: {}", options_.name, id, st.message());
        SendToClient(s.client, ErrorMsg{wire::ErrorCode::kBusy, id, "replay: " + st.message()});
        sessions_.erase(it);
        continue;
      }
    }
    // Every stage's receipt line commits to every position again, in order (stage_replay.cpp).
    s.rows = 0;
    s.commit = NewCommit();
    s.retry.reset();
    s.paused_since = since;
    OpenSessionMsg open{id, s.sampling, s.history, s.extra};
    open.keep = s.keep;
    open.replay = true;
    open.n_generated = static_cast<uint32_t>(s.n_generated);
    s.replay_out = true;
    if (!SendNext(open) || !SendKeptRows(id, skip, n)) {
      // The link dropped again: held again by the event that tells it.
      holds_.Hold(std::span<const uint32_t>(&id, 1), since.value_or(Clock::now()));
      continue;
    }
    for (int pos = skip; pos < n; pos += options_.chunk) {
      const int count = std::min(options_.chunk, n - pos);
      Work w;
      w.session = id;
      w.pos0 = pos;
      w.n_tokens = count;
      w.sample = pos + count == n;
      w.tokens.assign(s.history.begin() + pos, s.history.begin() + pos + count);
      scheduler_.AddPrefill(std::move(w));
    }
    repairs_.fetch_add(1);
    replayed_tokens_.fetch_add(static_cast<uint64_t>(n));
    KV_LOG_INFO("{}: session {} replayed: {} positions ({} generated), {} kept here", options_.name,
                id, n, s.n_generated, skip);
  }
}

void StageImpl::ResetForReplay(uint32_t session) {
  holds_.Release(session);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;  // a replacement: it never had the session
  window_->CloseSequence(static_cast<int>(session));
  scheduler_.TakeSession(session);
  sessions_.erase(it);
}

bool StageImpl::DrawnBeforeReplay(const Session& s) const {
  // Links keep their order, every stage handles what its predecessor sends in order, and drops
  // the session's queued rows when the replay's OPEN_SESSION reaches it: whatever the last stage
  // drew before the replay reaches the head before that OPEN_SESSION, and what it draws after,
  // behind it. Drawn before, a token may carry drafts or a guessed window the last stage, which
  // started drafting afresh, no longer has in flight, or come from a verify chunk whose rows the
  // replay did not run: the replay draws the same tokens again.
  return holds_.held(s.id) || s.replay_out;
}

void StageImpl::ReplayCameBack(uint32_t session) {
  auto it = sessions_.find(session);
  if (it != sessions_.end() && it->second.originated) it->second.replay_out = false;
}

bool StageImpl::AcceptsToken(Session& s, const TokenMsg& t) {
  // From before the replay, or another position than the one it waits for: the replay draws
  // the token at that position again.
  if (DrawnBeforeReplay(s) || t.token.pos != s.history.size()) return false;
  if (s.paused_since) {
    const double ms = MsSince(*s.paused_since);
    KV_LOG_INFO("{}: session {} resumed after a pause of {:.0f} ms", options_.name, s.id, ms);
    std::lock_guard<std::mutex> lock(replay_mu_);
    replay_counts_.AddPause(static_cast<uint64_t>(ms));
    s.paused_since.reset();
  }
  return true;
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
