// HeadRole, repair (docs/PROTOCOL.md, "Repair"): what only the head does for the sessions held
// while the ring was broken. Its sessions end with their clients told, and once its probe comes
// back around the repaired ring it replays every held session (stage_repair.cpp holds them on
// every stage; stage_replay.cpp runs only what a stage lacks), then takes only the tokens drawn
// after the replay, noting each client's pause.
#include <fmt/format.h>

#include <algorithm>

#include "base/log.h"
#include "ring/chunk_plan.h"
#include "ring/head_role.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {
namespace {

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

bool HeadRole::Holds(Session& s) {
  // Its CLOSE may be lost at the break; every other stage holds it and lets it expire.
  if (s.closing && !st_.holds_.held(s.id)) return false;
  // The head runs nothing for a held session: its rows would die at the break.
  st_.scheduler_.TakeSession(s.id);
  return true;
}

void HeadRole::OnDropped(const Session& s, const std::string& why) {
  if (!s.closing) {
    st_.SendToClient(s.client, ErrorMsg{wire::ErrorCode::kLinkDown, s.id, "session ended: " + why});
  }
}

void HeadRole::OnHeldEnded(const Session& s, const std::string& why) {
  if (!s.closing) st_.SendToClient(s.client, ErrorMsg{wire::ErrorCode::kLinkDown, s.id, why});
  // The stages before the break free it now; the others hold it and expire it too.
  st_.SendNext(CloseMsg{s.id, static_cast<uint8_t>(wire::FinishReason::kError)});
}

void HeadRole::ReplayHeld() {
  HoldBook& holds = st_.holds_;
  const int chunk = st_.options_.chunk;
  const RowCost cost = RowCostOf(st_.window_->config(), st_.options_.attn_type);
  for (uint32_t id : holds.ids()) {
    const auto since = holds.since(id);
    holds.Release(id);
    auto it = st_.sessions_.find(id);
    if (it == st_.sessions_.end()) continue;
    Session& s = it->second;
    if (s.closing) {
      // Ended while held: its CLOSE may have died at the break; send it around the whole ring.
      if (!st_.SendNext(CloseMsg{id, static_cast<uint8_t>(wire::FinishReason::kClientClosed)})) {
        continue;
      }
      st_.sessions_.erase(it);
      continue;
    }
    st_.scheduler_.TakeSession(id);
    const int n = static_cast<int>(s.history.size());
    // What this window still holds is kept, and its rows are sent on again (stage_replay.cpp);
    // without them, everything again from position 0.
    const int skip = st_.KeepForReplay(s, n);
    if (skip == 0) {
      st_.replay_rows_.Drop(id);
      st_.window_->CloseSequence(static_cast<int>(id));
      if (Status st = st_.OpenSequence(id); !st.ok()) {
        KV_LOG_WARN("{}: session {}: replay: {}", st_.options_.name, id, st.message());
        st_.SendToClient(s.client, ErrorMsg{wire::ErrorCode::kBusy, id, "replay: " + st.message()});
        st_.sessions_.erase(it);
        continue;
      }
    }
    // Every stage's receipt line commits to every position again, in order (stage_replay.cpp).
    s.rows = 0;
    s.commit = st_.NewCommit();
    s.retry.reset();
    s.paused_since = since;
    OpenSessionMsg open{id, s.sampling, s.history, s.extra};
    open.keep = s.keep;
    open.replay = true;
    open.n_generated = static_cast<uint32_t>(s.n_generated);
    s.replay_out = true;
    if (!st_.SendNext(open) || !SendKeptRows(id, skip, n)) {
      // The link dropped again: held again by the event that tells it.
      holds.Hold(std::span<const uint32_t>(&id, 1), since.value_or(Clock::now()));
      continue;
    }
    // Cut as a prompt is (chunk_plan.h): past a long kept part, by work.
    int pos = skip;
    for (const int count : PlanChunks(cost, skip, n - skip, chunk)) {
      Work w;
      w.session = id;
      w.pos0 = pos;
      w.n_tokens = count;
      w.sample = pos + count == n;
      w.tokens.assign(s.history.begin() + pos, s.history.begin() + pos + count);
      st_.scheduler_.AddPrefill(std::move(w));
      pos += count;
    }
    st_.repairs_.fetch_add(1);
    st_.replayed_tokens_.fetch_add(static_cast<uint64_t>(n));
    KV_LOG_INFO("{}: session {} replayed: {} positions ({} generated), {} kept here",
                st_.options_.name, id, n, s.n_generated, skip);
  }
}

bool HeadRole::SendKeptRows(uint32_t session, int skip, int n) {
  Session& s = st_.sessions_.at(session);
  const int chunk = st_.options_.chunk;
  for (int pos = 0; pos < skip; pos += chunk) {
    const int count = std::min(chunk, skip - pos);
    const uint16_t flags = pos + count == n ? wire::kHiddenSample : 0;
    const HiddenMsg kept = st_.replay_rows_.Rows(session, static_cast<uint32_t>(pos),
                                                 static_cast<uint32_t>(count), flags);
    Work w;
    w.session = session;
    w.pos0 = pos;
    w.n_tokens = count;
    w.tokens.assign(s.history.begin() + pos, s.history.begin() + pos + count);
    st_.CommitRows(w, &kept, std::nullopt);
    s.rows += static_cast<uint64_t>(count);
    if (!st_.SendNext(kept)) return false;
  }
  std::lock_guard<std::mutex> lock(st_.replay_mu_);
  st_.replay_counts_.kept += static_cast<uint64_t>(skip);
  st_.replay_counts_.recomputed += static_cast<uint64_t>(n - skip);
  return true;
}

bool HeadRole::DrawnBeforeReplay(const Session& s) const {
  // Links keep their order, every stage handles what its predecessor sends in order, and drops
  // the session's queued rows when the replay's OPEN_SESSION reaches it: whatever the last stage
  // drew before the replay reaches the head before that OPEN_SESSION, and what it draws after,
  // behind it. Drawn before, a token may carry drafts or a guessed window the last stage, which
  // started drafting afresh, no longer has in flight, or come from a verify chunk whose rows the
  // replay did not run: the replay draws the same tokens again.
  return st_.holds_.held(s.id) || s.replay_out;
}

void HeadRole::ReplayCameBack(uint32_t session) {
  auto it = st_.sessions_.find(session);
  if (it != st_.sessions_.end()) it->second.replay_out = false;
}

bool HeadRole::AcceptsToken(Session& s, const TokenMsg& t) {
  // From before the replay, or another position than the one it waits for: the replay draws
  // the token at that position again.
  if (DrawnBeforeReplay(s) || t.token.pos != s.history.size()) return false;
  if (s.paused_since) {
    const double ms = MsSince(*s.paused_since);
    KV_LOG_INFO("{}: session {} resumed after a pause of {:.0f} ms", st_.options_.name, s.id, ms);
    std::lock_guard<std::mutex> lock(st_.replay_mu_);
    st_.replay_counts_.AddPause(static_cast<uint64_t>(ms));
    s.paused_since.reset();
  }
  return true;
}

}  // namespace kvasir::ring
