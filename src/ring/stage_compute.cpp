// Stage runtime, part 4: the compute loop. Only the thread in Run() executes this file, so session
// state needs no locks. Control messages are handled as they arrive; hidden-state work is batched
// across sessions (decode steps first, then prompt chunks) into one Forward per loop turn. Where a
// stage is in the ring is its two roles' business (stage_roles.h): the loop calls them; this file
// is the loop and a ring member's sessions, which MemberEntry hands it.
#include <fmt/format.h>

#include <algorithm>

#include "base/log.h"
#include "base/timing_trace.h"
#include "ring/sampling_wire.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {
namespace {

uint64_t NsSince(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
}

}  // namespace

void StageImpl::TraceWork(std::span<const Work> items, std::string_view event) const {
  if (!TimingTraceEnabled()) return;
  int rows = 0;
  for (const Work& w : items) rows += w.n_tokens;
  for (const Work& w : items) {
    TraceTiming(options_.name, event, "session={} pos0={} rows={} batch_rows={}", w.session, w.pos0,
                w.n_tokens, rows);
  }
}

void StageImpl::HandleEvent(Event& e) {
  switch (e.kind) {
    case Event::Kind::kMessage:
      HandleMessage(e);
      break;
    case Event::Kind::kPredDown:
    case Event::Kind::kSuccDown:
      RingBroken(e.reason, e.kind == Event::Kind::kPredDown);
      break;
    case Event::Kind::kSuccUp:
      entry_->OnSuccUp();
      break;
    case Event::Kind::kClientGone:
      entry_->OnClientGone(e.client);
      break;
    case Event::Kind::kWake:
      break;
  }
}

void StageImpl::HandleMessage(Event& e) {
  Message& m = *e.msg;
  if (e.from_pred) {
    entry_->OnPredMessage(m);
  } else {
    entry_->OnClientMessage(e.client, m, std::move(e.charge));
  }
}

void StageImpl::HandleOpen(OpenSessionMsg& o) {
  // Every stage checks what it is sent before it opens anything, not only the head; the last
  // stage's sampler is only ever made from checked values.
  TraceTiming(options_.name, "open_in", "session={} cached={}", o.session, o.n_cached);
  if (o.replay && ResumeReplay(o)) return;  // kept its state (stage_replay.cpp)
  auto tail = exit_->CheckOpen(o);
  if (!tail.ok()) {
    const Status& checked = tail.status();
    KV_LOG_WARN("{}: session {} refused: OPEN_SESSION: {}", options_.name, o.session,
                checked.message());
    SendNext(
        ErrorMsg{wire::ErrorCode::kBadRequest, o.session, "OPEN_SESSION: " + checked.message()});
    return;
  }
  if (o.fork_from != 0) {
    if (!ForkSequence(o.fork_from, o.session, static_cast<int>(o.n_cached))) {
      SendNext(ErrorMsg{wire::ErrorCode::kCacheMiss, o.session,
                        fmt::format("OPEN_SESSION: session {} is not kept here with {} positions",
                                    o.fork_from, o.n_cached)});
      return;
    }
  } else if (Status st = OpenSequence(o.session); !st.ok()) {
    KV_LOG_WARN("{}: session {}: {}", options_.name, o.session, st.message());
    SendNext(ErrorMsg{wire::ErrorCode::kBusy, o.session, st.message()});
    return;
  }
  Session& s = sessions_[o.session];
  s.id = o.session;
  s.sampling = o.sampling;
  s.n_prompt = static_cast<int>(o.prompt.size());
  s.keep = o.keep;
  s.n_cached = o.n_cached;
  s.commit = NewCommit();
  s.tail = std::move(tail).value();
  if (spec_) s.draft = spec_->NewSession(o.session, s.tail->has_grammar());
  KV_LOG_INFO("{}: session {} open", options_.name, o.session);
  TraceTiming(options_.name, "open_out", "session={} cached={}", o.session, o.n_cached);
  SendNext(o);
}

void StageImpl::HandleHidden(HiddenMsg& h) {
  if (sessions_.count(h.session) == 0) {
    KV_LOG_DEBUG("{}: HIDDEN for unknown session {} dropped", options_.name, h.session);
    return;
  }
  if (h.n_embd != static_cast<uint32_t>(window_->config().n_embd)) {
    SendNext(ErrorMsg{wire::ErrorCode::kBadRequest, h.session,
                      fmt::format("HIDDEN: n_embd {} does not match this stage's {}", h.n_embd,
                                  window_->config().n_embd)});
    sessions_.erase(h.session);
    window_->CloseSequence(static_cast<int>(h.session));
    return;
  }
  // Sizes are checked before the rows are widened to f32 (a bf16 HIDDEN doubles).
  const uint64_t end = uint64_t{h.pos0} + h.n_tokens;
  if (end > static_cast<uint64_t>(window_->n_ctx())) {
    const std::string why =
        fmt::format("HIDDEN: rows {}..{} pass the context of {}", h.pos0, end, window_->n_ctx());
    KV_LOG_WARN("{}: session {} refused: {}", options_.name, h.session, why);
    FailSession(h.session, wire::ErrorCode::kTooLarge, why);
    return;
  }
  Session& s = sessions_[h.session];
  if (s.replay_skip > 0 && !SkipReplayed(s, h)) return;  // kept here (stage_replay.cpp)
  TraceTiming(options_.name, "hidden_in", "session={} pos0={} rows={}", h.session, h.pos0,
              h.n_tokens);
  Work w;
  w.session = h.session;
  w.pos0 = static_cast<int>(h.pos0);
  w.n_tokens = static_cast<int>(h.n_tokens);
  w.sample = (h.flags & wire::kHiddenSample) != 0;
  w.verify = (h.flags & wire::kHiddenVerify) != 0;
  HiddenToF32(h, &w.hidden);
  // Prompt chunks keep their order in the prefill queue; only steps past the prompt are decode.
  if (w.pos0 >= s.n_prompt) {
    scheduler_.AddDecode(std::move(w));
  } else {
    scheduler_.AddPrefill(std::move(w));
  }
}

void StageImpl::FailSession(uint32_t session, wire::ErrorCode code, const std::string& why) {
  if (sessions_.count(session) != 0) entry_->FailSession(session, code, why);
}

void StageImpl::HandleClose(const CloseMsg& c) {
  auto it = sessions_.find(c.session);
  if (it != sessions_.end()) {
    // The rows sent before the CLOSE run first (their outputs go on ahead of it), so every stage
    // runs the same rows as the head, and its receipt line agrees with the others.
    for (const Work& w : scheduler_.TakeSession(c.session)) {
      if (sessions_.count(c.session) == 0) break;  // a row failed: the session ended with it
      RunWork(std::span<const Work>(&w, 1));
    }
    it = sessions_.find(c.session);
  }
  if (it != sessions_.end()) {
    KeepOrClose(it->second, static_cast<wire::FinishReason>(c.reason));
    KeepClosedRows(it->second);
    sessions_.erase(it);
    KV_LOG_INFO("{}: session {} closed", options_.name, c.session);
  }
  SendNext(c);
}

void StageImpl::HandleError(const ErrorMsg& e) {
  if (e.session == 0) {
    if (e.code == wire::ErrorCode::kLinkDown) RingBroken(e.message, true);
    return;
  }
  auto it = sessions_.find(e.session);
  if (it != sessions_.end()) {
    window_->CloseSequence(static_cast<int>(e.session));
    sessions_.erase(it);
  }
  SendNext(e);
}

void StageImpl::FailAll(const std::string& why, bool forward) {
  if (!sessions_.empty()) {
    KV_LOG_WARN("{}: dropping {} session(s): {}", options_.name, sessions_.size(), why);
  }
  for (auto& [id, s] : sessions_) {
    window_->CloseSequence(static_cast<int>(id));
    entry_->OnDropped(s, why);
  }
  sessions_.clear();
  scheduler_.Clear();
  entry_->OnRingDown(why, forward);
}

bool StageImpl::RunBatch() {
  if (replay_rows_.sessions() > 0) {
    replay_rows_.Retain([&](uint32_t id) { return sessions_.count(id) != 0; });
  }
  // A closing session's queued rows are dropped: its KV cache is gone, its CLOSE went out.
  const std::vector<Work> batch = scheduler_.NextBatch([&](uint32_t session) {
    auto it = sessions_.find(session);
    return it != sessions_.end() && !it->second.closing;
  });
  if (batch.empty()) return false;
  RunWork(batch);
  return true;
}

void StageImpl::RunWork(std::span<const Work> all) {
  // Rows rejected by a verify chunk are dropped when the session's next chunk runs, not when it
  // arrives: with overlap, chunks queued ahead of it may still add rows (stage_spec.cpp).
  std::vector<Work> kept;
  std::span<const Work> batch = all;
  if (!RollBackBeforeRows(all, &kept)) batch = kept;
  ForwardInput in;
  std::vector<int32_t> tokens;
  std::vector<float> hidden;
  uint64_t ns = 0;
  auto forward = [&](std::span<const Work> items, ForwardOutput* out) {
    BuildForwardInput(items, &in, &tokens, &hidden);
    in.want_hidden = spec_ != nullptr && spec_->wants_hidden();  // mtp, on the last stage
    TraceWork(items, "compute_start");
    const auto t0 = Clock::now();
    Status s = window_->Forward(in, out);
    ns += NsSince(t0);
    TraceWork(items, "compute_end");
    return s;
  };
  auto done = [&](std::span<const Work> items, const ForwardOutput& out) {
    for (const Work& w : items) {
      if (auto it = sessions_.find(w.session); it != sessions_.end()) {
        it->second.rows += static_cast<uint64_t>(w.n_tokens);
      }
      NoteRan(w);
    }
    exit_->EmitOutputs(items, out);
  };
  auto failed = [&](const Work& w, const Status& e) {
    KV_LOG_WARN("{}: session {}: {}", options_.name, w.session, e.message());
    FailSession(w.session, wire::ErrorCode::kBadRequest, e.message());
  };
  if (!RunBatchOrEach(batch, forward, done, failed)) return;
  int rows = 0;
  bool all_decode = true;
  for (const Work& w : batch) {
    rows += w.n_tokens;
    all_decode = all_decode && w.n_tokens == 1;
  }
  rows_.fetch_add(rows);
  busy_ns_.fetch_add(ns);
  if (all_decode) {
    decode_rows_.fetch_add(rows);
    decode_busy_ns_.fetch_add(ns);
  }
}

}  // namespace kvasir::ring
