// Stage runtime, replay (docs/PROTOCOL.md, "Repair"): a replayed session is run again only where
// a stage lacks it. Each stage keeps the boundary rows it sent on for its live sessions
// (ReplayRows, within --replay-mb). When the head replays a held session of n positions, every
// stage that still holds the session's state at k positions keeps the first
// min(k, n, rows kept) of them (the last stage min(k, n - 1): the last position's logits draw the
// next token), sends its kept rows on for those positions instead of running them, and runs only
// the rest; a replacement, or a stage that kept no rows, runs every position. Every link carries
// every position again, so no stage needs to know what its successor holds, and a stage that
// cannot keep its state (no rows kept, a recurrent window outside its rollback span, drafting)
// falls back to running everything, alone. What a stage keeps is its own state: a peer's
// messages only say which positions to run, and rows below what a stage holds are never taken
// from them.
#include <fmt/format.h>

#include <algorithm>

#include "base/log.h"
#include "ring/sampling_wire.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {

int StageImpl::KeepForReplay(Session& s, int n) {
  const int held = window_->SequenceLength(static_cast<int>(s.id));
  if (held <= 0 || n <= 0 || options_.replay_bytes == 0) return 0;  // --replay-mb 0: run all
  int keep = std::min(held, n);
  if (s.verify.n_rows > 0 && held == s.verify.pos0 + s.verify.n_rows) {
    // The last rows run were verify chunks, not yet rolled back: past their first row (the token
    // fed) they may be drafts the last stage rejected, where the replay has other ids.
    keep = std::min(keep, s.verify.pos0 + 1);
  }
  keep = std::min(keep, exit_->ReplayKeepLimit(s, n));
  if (keep <= 0) return 0;
  if (keep < held && !window_->TruncateSequence(static_cast<int>(s.id), keep).ok()) {
    return 0;  // a recurrent window outside its rollback span: from position 0
  }
  replay_rows_.Truncate(s.id, static_cast<uint32_t>(keep));
  s.verify = VerifySpan{};
  return keep;
}

bool StageImpl::ResumeReplay(OpenSessionMsg& o) {
  holds_.Release(o.session);
  const int n = static_cast<int>(o.prompt.size());
  auto recompute = [&] {
    ResetForReplay(o.session);
    std::lock_guard<std::mutex> lock(replay_mu_);
    replay_counts_.recomputed += static_cast<uint64_t>(n);
    return false;
  };
  auto it = sessions_.find(o.session);
  // A replacement never had the session; a stage that drafts cannot resume its drafts' state.
  if (it == sessions_.end() || o.fork_from != 0 || spec_ != nullptr) return recompute();
  Session& s = it->second;
  // Rows queued before the replay were sent before the break: they run again from the replay.
  scheduler_.TakeSession(o.session);
  const int keep = KeepForReplay(s, n);
  if (keep == 0) return recompute();
  // The same checks as a new session's; a failure opens it afresh, where it is refused.
  auto tail = exit_->CheckOpen(o);
  if (!tail.ok()) return recompute();
  s.tail = std::move(tail).value();
  s.sampling = o.sampling;
  s.n_prompt = n;
  s.keep = o.keep;
  s.replay_skip = static_cast<uint32_t>(keep);
  // Its receipt line commits to every replayed position again, in order, kept or run: the
  // leaves line up with its neighbours' (and with a replacement's) as after a full replay.
  s.rows = 0;
  s.commit = NewCommit();
  {
    std::lock_guard<std::mutex> lock(replay_mu_);
    replay_counts_.kept += static_cast<uint64_t>(keep);
    replay_counts_.recomputed += static_cast<uint64_t>(n - keep);
  }
  KV_LOG_INFO("{}: session {} replayed: {} of {} positions kept", options_.name, o.session, keep,
              n);
  SendNext(o);
  return true;
}

bool StageImpl::SkipReplayed(Session& s, HiddenMsg& h) {
  const uint32_t skip = s.replay_skip;
  if (h.pos0 >= skip) {
    s.replay_skip = 0;  // past what it kept: a normal session again
    return true;
  }
  const uint32_t end = h.pos0 + h.n_tokens;  // checked against the context before
  const uint32_t upto = std::min(end, skip);
  const uint32_t count = upto - h.pos0;
  if ((h.flags & wire::kHiddenVerify) != 0) {
    FailSession(s.id, wire::ErrorCode::kBadRequest,
                fmt::format("replay: a verify chunk at position {}, which this stage kept from "
                            "before the replay",
                            h.pos0));
    return false;
  }
  // The positions kept are committed to as they were run before: the rows taken in (the
  // predecessor's kept rows, the same bytes) and the rows sent on.
  Work w;
  w.session = s.id;
  w.pos0 = static_cast<int>(h.pos0);
  w.n_tokens = static_cast<int>(count);
  HiddenToF32(h, &w.hidden);
  w.hidden.resize(static_cast<size_t>(count) * h.n_embd);
  if (!exit_->PassKept(s, h, w, upto)) return false;
  s.rows += count;
  if (upto == end) return false;
  const size_t row_bytes = static_cast<size_t>(h.n_embd) * wire::DtypeSize(h.dtype);
  h.data.erase(h.data.begin(), h.data.begin() + static_cast<std::ptrdiff_t>(count * row_bytes));
  h.n_tokens = end - upto;
  h.pos0 = upto;
  s.replay_skip = 0;
  return true;
}

wire::RepairStatsWire StageImpl::RepairRecord() const {
  wire::RepairStatsWire w{};
  w.repairs = repairs_.load();
  std::lock_guard<std::mutex> lock(replay_mu_);
  w.kept = replay_counts_.kept;
  w.recomputed = replay_counts_.recomputed;
  w.pauses = replay_counts_.pauses;
  w.pause_ms_total = replay_counts_.pause_ms_total;
  w.pause_ms_max = replay_counts_.pause_ms_max;
  return w;
}

void StageImpl::AddRepairRecord(StatsMsg& m) const {
  const wire::RepairStatsWire w = RepairRecord();
  const bool any = w.repairs != 0 || w.kept != 0 || w.recomputed != 0 || w.pauses != 0;
  if (!any && m.repairs.empty()) return;
  m.repairs.resize(m.records.size() - 1);  // zeros for the stages before, which replayed nothing
  m.repairs.push_back(w);
}

}  // namespace kvasir::ring
