// Stage runtime, part 4: the compute loop. Only the thread in Run() executes this file, so session
// state needs no locks. Control messages are handled as they arrive; hidden-state work is batched
// across sessions (decode steps first, then prompt chunks) into one Forward per loop turn.
#include <fmt/format.h>

#include <algorithm>

#include "base/log.h"
#include "ring/link_limits.h"
#include "ring/sampling_wire.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {
namespace {

uint64_t NsSince(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
}

}  // namespace

void StageImpl::HandleEvent(Event& e) {
  switch (e.kind) {
    case Event::Kind::kMessage:
      HandleMessage(e);
      break;
    case Event::Kind::kPredDown:
    case Event::Kind::kSuccDown:
      FailAll(e.reason, e.kind == Event::Kind::kPredDown);
      break;
    case Event::Kind::kSuccUp:
      ring_closed_ = false;
      last_probe_ = {};
      break;
    case Event::Kind::kClientGone: {
      std::vector<uint32_t> ids;
      for (auto& [id, s] : sessions_) {
        if (s.originated && s.client == e.client && !s.closing) ids.push_back(id);
      }
      for (uint32_t id : ids) EndSession(id, wire::FinishReason::kClientClosed, "");
      std::erase(stats_waiters_, e.client);
      std::erase_if(waiting_generates_, [&](const auto& w) { return w.client == e.client; });
      break;
    }
    case Event::Kind::kWake:
      break;
  }
}

void StageImpl::HandleMessage(Event& e) {
  Message& m = *e.msg;
  if (!e.from_pred) {
    // From a client of the head.
    if (auto* g = std::get_if<GenerateMsg>(&m)) {
      HandleGenerate(e.client, *g, std::move(e.charge));
    } else if (auto* c = std::get_if<CloseMsg>(&m)) {
      auto it = sessions_.find(c->session);
      if (it != sessions_.end() && it->second.client == e.client && !it->second.closing) {
        EndSession(c->session, wire::FinishReason::kClientClosed, "");
      }
    } else if (auto* st = std::get_if<StatsMsg>(&m)) {
      if (!st->records.empty()) {
        SendToClient(e.client, ErrorMsg{wire::ErrorCode::kBadRequest, 0,
                                        "STATS from a client must carry no records"});
        return;
      }
      st->records.push_back(StatsRecord());
      if (ring_closed_ && SendNext(*st)) {
        stats_waiters_.push_back(e.client);
      } else {
        SendToClient(e.client, ErrorMsg{wire::ErrorCode::kLinkDown, 0, "the ring is not closed"});
      }
    } else if (auto* p = std::get_if<PingMsg>(&m)) {
      SendToClient(e.client, PingMsg{true, p->body});
    } else {
      SendToClient(e.client, ErrorMsg{wire::ErrorCode::kBadRequest, 0,
                                      fmt::format("unexpected {} from a client", MessageName(m))});
    }
    return;
  }
  if (auto* o = std::get_if<OpenSessionMsg>(&m)) {
    HandleOpen(*o);
  } else if (auto* h = std::get_if<HiddenMsg>(&m)) {
    HandleHidden(*h);
  } else if (auto* t = std::get_if<TokenMsg>(&m)) {
    HandleToken(*t);
  } else if (auto* c = std::get_if<CloseMsg>(&m)) {
    HandleClose(*c, true);
  } else if (auto* err = std::get_if<ErrorMsg>(&m)) {
    HandleError(*err);
  } else if (auto* p = std::get_if<PingMsg>(&m)) {
    if (is_head() && !p->pong && p->body.nonce == probe_nonce_) {
      if (!ring_closed_) KV_LOG_INFO("{}: ring closed", options_.name);
      ring_closed_ = true;
      std::deque<WaitingGenerate> waiting;
      waiting.swap(waiting_generates_);
      for (WaitingGenerate& w : waiting) StartSession(w.client, w.request);
    } else if (!is_head()) {
      SendNext(*p);
    }
  } else if (auto* r = std::get_if<ReceiptMsg>(&m)) {
    HandleReceipt(*r);
  } else if (auto* st = std::get_if<StatsMsg>(&m)) {
    if (is_head()) {
      if (!stats_waiters_.empty()) {
        SendToClient(stats_waiters_.front(), *st);
        stats_waiters_.pop_front();
      }
    } else if (st->records.size() >= wire::kMaxStatsRecords) {
      KV_LOG_WARN("{}: STATS with {} records dropped (a ring has at most {} stages)", options_.name,
                  st->records.size(), wire::kMaxStatsRecords);
    } else {
      st->records.push_back(StatsRecord());
      SendNext(*st);
    }
  }
}

void StageImpl::MaybeProbeRing() {
  if (!is_head() || ring_closed_) return;
  const auto now = Clock::now();
  if (now - last_probe_ < std::chrono::milliseconds(300)) return;
  last_probe_ = now;
  PingMsg probe{false, {probe_nonce_, 0}};
  SendNext(probe);
}

void StageImpl::HandleGenerate(uint64_t client, GenerateMsg& g, ByteCharge charge) {
  // A refused request is answered with ERROR for session 0; the client's link stays open.
  Status checked = CheckSamplingWire(g.sampling);
  if (checked.ok()) checked = CheckSamplingExtra(g.extra, window_->config().n_vocab);
  if (!checked.ok()) {
    SendToClient(client,
                 ErrorMsg{wire::ErrorCode::kBadRequest, 0, "GENERATE: " + checked.message()});
    return;
  }
  // Stop strings live as long as the session: bounded here, whatever the record limit allowed.
  size_t stop_bytes = 0;
  for (const std::string& stop : g.stops) stop_bytes += sizeof(uint16_t) + stop.size();
  if (stop_bytes > kMaxClientStopBytes) {
    SendToClient(client, ErrorMsg{wire::ErrorCode::kBadRequest, 0,
                                  fmt::format("GENERATE: stop strings of {} bytes exceed this "
                                              "head's limit of {} bytes",
                                              stop_bytes, kMaxClientStopBytes)});
    return;
  }
  int open = 0;
  for (const auto& [id, s] : sessions_) open += s.originated && s.client == client && !s.closing;
  for (const auto& w : waiting_generates_) open += w.client == client;
  if (open >= options_.max_sessions_per_client) {
    SendToClient(client, ErrorMsg{wire::ErrorCode::kBusy, 0,
                                  fmt::format("a client may have {} sessions at once",
                                              options_.max_sessions_per_client)});
    return;
  }
  if (!ring_closed_) {
    // Starts once the ring probe has gone all the way around.
    if (waiting_generates_.size() >= static_cast<size_t>(options_.max_sessions)) {
      SendToClient(client, ErrorMsg{wire::ErrorCode::kBusy, 0, "the ring is not closed yet"});
      return;
    }
    waiting_generates_.push_back({client, std::move(g), std::move(charge)});
    return;
  }
  StartSession(client, g);
}

void StageImpl::StartSession(uint64_t client, GenerateMsg& g, bool use_cache) {
  auto encoded = EncodePrompt(*tokenizer_, g, window_->n_ctx());
  auto refuse = [&](wire::ErrorCode code, const std::string& why) {
    KV_LOG_WARN("{}: refused a request: {}", options_.name, why);
    SendToClient(client, ErrorMsg{code, 0, why});
  };
  if (!encoded.ok()) {
    // A prompt over the context is kTooLarge, so a client can tell it from other refusals.
    return refuse(encoded.status().code() == StatusCode::kTooLarge ? wire::ErrorCode::kTooLarge
                                                                   : wire::ErrorCode::kBadRequest,
                  encoded.status().message());
  }
  std::vector<int32_t> ids = std::move(encoded).value();
  uint32_t id = next_session_++;
  if (id == 0) id = next_session_++;
  std::unique_ptr<TailSampler> tail;
  if (is_last()) {
    auto t = TailSampler::Create(g.sampling, ids, window_->n_ctx(), window_->config().n_vocab,
                                 g.extra, &vocab_trie_);
    if (!t.ok()) return refuse(wire::ErrorCode::kBadRequest, "GENERATE: " + t.status().message());
    tail = std::move(t).value();
  }
  // The prompt cache: the kept session whose positions this prompt starts with, taken over.
  uint32_t fork_from = 0;
  int n_cached = 0;
  if (use_cache && cache_.budget() > 0) {
    ExpireCache();
    if (auto m = cache_.Best(ids, recurrent_); m && ForkSequence(m->session, id, m->n_keep)) {
      fork_from = m->session;
      n_cached = m->n_keep;
    }
  }
  if (fork_from == 0) {
    if (Status s = OpenSequence(id); !s.ok()) return refuse(wire::ErrorCode::kBusy, s.message());
  }
  Session& s = sessions_[id];
  s.id = id;
  s.sampling = g.sampling;
  s.n_prompt = static_cast<int>(ids.size());
  s.originated = true;
  s.commit = NewCommit();
  s.client = client;
  s.report_cached = g.report_cached;
  s.keep = cache_.budget() > 0;
  s.n_cached = static_cast<uint32_t>(n_cached);
  if (s.keep) s.history = ids;
  // A stage may not have kept what this one takes over: then it opens afresh, from the request.
  if (fork_from != 0) s.retry = std::make_unique<GenerateMsg>(g);
  s.stops = StopMatcher(std::move(g.stops));
  s.tail = std::move(tail);
  KV_LOG_INFO("{}: session {} open: {} prompt tokens ({} from the prompt cache), up to {} new",
              options_.name, id, ids.size(), n_cached, g.sampling.max_tokens);
  OpenSessionMsg open{id, g.sampling, ids, g.extra};
  open.fork_from = fork_from;
  open.n_cached = static_cast<uint32_t>(n_cached);
  open.keep = s.keep;
  if (!SendNext(open)) {
    EndSession(id, wire::FinishReason::kError, "the link to the next stage is down");
    return;
  }
  for (int pos = n_cached; pos < s.n_prompt; pos += options_.chunk) {
    Work w;
    w.session = id;
    w.pos0 = pos;
    w.n_tokens = std::min(options_.chunk, s.n_prompt - pos);
    w.sample = pos + w.n_tokens == s.n_prompt;
    w.tokens.assign(ids.begin() + pos, ids.begin() + pos + w.n_tokens);
    scheduler_.AddPrefill(std::move(w));
  }
}

void StageImpl::HandleOpen(OpenSessionMsg& o) {
  if (is_head()) return;  // our own OPEN came back around the ring
  // Every stage checks what it is sent before it opens anything, not only the head; the last
  // stage's sampler is only ever made from checked values.
  std::unique_ptr<TailSampler> tail;
  Status checked;
  if (is_last()) {
    auto t = TailSampler::Create(o.sampling, o.prompt, window_->n_ctx(), window_->config().n_vocab,
                                 o.extra, &vocab_trie_);
    if (t.ok()) tail = std::move(t).value();
    checked = t.status();
  } else {
    checked = CheckSessionRequest(o.sampling, o.prompt, window_->n_ctx(), window_->config().n_vocab,
                                  o.extra);
  }
  if (!checked.ok()) {
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
  s.tail = std::move(tail);
  KV_LOG_INFO("{}: session {} open", options_.name, o.session);
  SendNext(o);
}

void StageImpl::HandleHidden(HiddenMsg& h) {
  if (is_head()) return;  // the head never takes hidden states: its predecessor sends tokens
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
  const Session& s = sessions_[h.session];
  Work w;
  w.session = h.session;
  w.pos0 = static_cast<int>(h.pos0);
  w.n_tokens = static_cast<int>(h.n_tokens);
  w.sample = (h.flags & wire::kHiddenSample) != 0;
  HiddenToF32(h, &w.hidden);
  // Prompt chunks keep their order in the prefill queue; only steps past the prompt are decode.
  if (w.pos0 >= s.n_prompt) {
    scheduler_.AddDecode(std::move(w));
  } else {
    scheduler_.AddPrefill(std::move(w));
  }
}

void StageImpl::HandleToken(const TokenMsg& t) {
  if (!is_head()) {
    SendNext(t);
    return;
  }
  auto it = sessions_.find(t.token.session);
  if (it == sessions_.end() || it->second.closing) return;
  Session& s = it->second;
  s.n_generated++;
  s.retry.reset();  // every stage has the session: no fallback from here on
  TokenMsg out = PresentToken(t, *tokenizer_, s.n_prompt, &s.stops);
  if (s.report_cached && s.n_generated == 1) out.n_cached = s.n_cached;
  const bool finished = out.token.finished != 0;
  SendToClient(s.client, out);
  if (finished) {
    EndSession(s.id, static_cast<wire::FinishReason>(out.token.reason), "");
    return;
  }
  Work w;
  w.session = s.id;
  w.pos0 = static_cast<int>(t.token.pos);
  w.n_tokens = 1;
  w.sample = true;
  w.tokens = {t.token.id};
  if (s.keep) s.history.push_back(t.token.id);
  scheduler_.AddDecode(std::move(w));
}

void StageImpl::FailSession(uint32_t session, wire::ErrorCode code, const std::string& why) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  if (it->second.originated) {
    EndSession(session, wire::FinishReason::kError, why);
    return;
  }
  window_->CloseSequence(static_cast<int>(session));
  sessions_.erase(it);
  SendNext(ErrorMsg{code, session, why});
}

void StageImpl::EndSession(uint32_t session, wire::FinishReason reason, const std::string& error) {
  auto it = sessions_.find(session);
  // A session whose CLOSE is already on its way ends once (one CLOSE, one receipt).
  if (it == sessions_.end() || it->second.closing) return;
  Session& s = it->second;
  KeepOrClose(s, error.empty() ? reason : wire::FinishReason::kError);
  if (s.originated) {
    if (!error.empty()) {
      SendToClient(s.client, ErrorMsg{wire::ErrorCode::kBadRequest, session, error});
    }
    KV_LOG_INFO("{}: session {} closed: {} after {} tokens", options_.name, session,
                error.empty() ? wire::FinishReasonName(static_cast<uint8_t>(reason)) : error,
                s.n_generated);
    if (SendNext(CloseMsg{session, static_cast<uint8_t>(reason)})) {
      s.closing = true;  // dropped when the CLOSE comes back around
      SendReceipt(s);    // behind the CLOSE: links keep their order
      return;
    }
  }
  sessions_.erase(it);
}

void StageImpl::HandleClose(const CloseMsg& c, bool from_pred) {
  auto it = sessions_.find(c.session);
  if (is_head()) {
    if (it != sessions_.end() && it->second.closing) sessions_.erase(it);
    return;
  }
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
  if (from_pred) SendNext(c);
}

void StageImpl::HandleError(const ErrorMsg& e) {
  if (e.session == 0) {
    if (e.code == wire::ErrorCode::kLinkDown) FailAll(e.message, true);
    return;
  }
  auto it = sessions_.find(e.session);
  if (is_head()) {
    if (e.code == wire::ErrorCode::kCacheMiss && RetryWithoutCache(e.session)) return;
    if (it != sessions_.end() && it->second.originated) {
      Session& s = it->second;
      SendToClient(s.client, ErrorMsg{e.code, e.session, e.message});
      window_->CloseSequence(static_cast<int>(e.session));
      sessions_.erase(it);
      KV_LOG_WARN("{}: session {} failed: {}", options_.name, e.session, e.message);
    }
    return;
  }
  if (it != sessions_.end()) {
    window_->CloseSequence(static_cast<int>(e.session));
    sessions_.erase(it);
  }
  SendNext(e);
}

void StageImpl::FailAll(const std::string& why, bool forward) {
  if (is_head()) ring_closed_ = false;
  if (!sessions_.empty()) {
    KV_LOG_WARN("{}: dropping {} session(s): {}", options_.name, sessions_.size(), why);
  }
  for (auto& [id, s] : sessions_) {
    window_->CloseSequence(static_cast<int>(id));
    if (s.originated && !s.closing) {
      SendToClient(s.client, ErrorMsg{wire::ErrorCode::kLinkDown, id, "session ended: " + why});
    }
  }
  sessions_.clear();
  scheduler_.Clear();
  if (forward && !is_head()) SendNext(ErrorMsg{wire::ErrorCode::kLinkDown, 0, why});
  if (is_head()) {
    for (uint64_t client : stats_waiters_) {
      SendToClient(client, ErrorMsg{wire::ErrorCode::kLinkDown, 0, why});
    }
    stats_waiters_.clear();
  }
}

bool StageImpl::RunBatch() {
  // A closing session's queued rows are dropped: its KV cache is gone, its CLOSE went out.
  const std::vector<Work> batch = scheduler_.NextBatch([&](uint32_t session) {
    auto it = sessions_.find(session);
    return it != sessions_.end() && !it->second.closing;
  });
  if (batch.empty()) return false;
  RunWork(batch);
  return true;
}

void StageImpl::RunWork(std::span<const Work> batch) {
  ForwardInput in;
  std::vector<int32_t> tokens;
  std::vector<float> hidden;
  uint64_t ns = 0;
  auto forward = [&](std::span<const Work> items, ForwardOutput* out) {
    BuildForwardInput(items, &in, &tokens, &hidden);
    const auto t0 = Clock::now();
    Status s = window_->Forward(in, out);
    ns += NsSince(t0);
    return s;
  };
  auto done = [&](std::span<const Work> items, const ForwardOutput& out) {
    for (const Work& w : items) {
      if (auto it = sessions_.find(w.session); it != sessions_.end()) {
        it->second.rows += static_cast<uint64_t>(w.n_tokens);
      }
    }
    EmitOutputs(items, out);
  };
  auto failed = [&](const Work& w, const Status& e) {
    KV_LOG_WARN("{}: session {}: {}", options_.name, w.session, e.message());
    if (is_head()) {
      EndSession(w.session, wire::FinishReason::kError, e.message());
    } else {
      window_->CloseSequence(static_cast<int>(w.session));
      sessions_.erase(w.session);
      SendNext(ErrorMsg{wire::ErrorCode::kBadRequest, w.session, e.message()});
    }
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

void StageImpl::EmitOutputs(std::span<const Work> batch, const ForwardOutput& out) {
  const int n_embd = window_->config().n_embd;
  const int n_vocab = window_->config().n_vocab;
  size_t row = 0, logit_row = 0;
  for (const Work& w : batch) {
    if (!is_last()) {
      HiddenMsg h = MakeHidden(
          w.session, static_cast<uint32_t>(w.pos0), static_cast<uint32_t>(w.n_tokens),
          static_cast<uint32_t>(n_embd), options_.boundary, w.sample ? wire::kHiddenSample : 0,
          std::span<const float>(out.hidden).subspan(row * n_embd,
                                                     static_cast<size_t>(w.n_tokens) * n_embd));
      CommitRows(w, &h, std::nullopt);
      SendNext(h);
      row += w.n_tokens;
      continue;
    }
    if (!w.sample) {
      CommitRows(w, nullptr, std::nullopt);
      continue;
    }
    auto it = sessions_.find(w.session);
    if (it == sessions_.end()) {
      ++logit_row;
      continue;
    }
    Session& s = it->second;
    std::span<const float> logits(out.logits.data() + logit_row * n_vocab, n_vocab);
    ++logit_row;
    auto sampled = s.tail->Sample(w.session, logits, w.pos0 + w.n_tokens, window_->n_ctx(),
                                  [&](int32_t id) { return tokenizer_->IsEog(id); });
    if (!sampled.ok()) {
      KV_LOG_WARN("{}: session {}: {}", options_.name, w.session, sampled.status().message());
      FailSession(w.session, wire::ErrorCode::kBadRequest, sampled.status().message());
      continue;
    }
    TokenMsg& t = *sampled;
    CommitRows(w, nullptr, t.token.id);
    if (is_head()) {
      HandleToken(t);  // a one-stage ring: the head samples for itself
    } else {
      SendNext(t);
    }
  }
}

}  // namespace kvasir::ring
