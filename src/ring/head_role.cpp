// HeadRole: the head's clients, the sessions it opens and what comes back to it (head_role.h).
#include "ring/head_role.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "base/log.h"
#include "base/timing_trace.h"
#include "ring/chunk_plan.h"
#include "ring/link_limits.h"
#include "ring/sampling_wire.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {

HeadRole::HeadRole(StageImpl& stage) : st_(stage) {
  std::random_device rd;
  // Session ids start at a random point so a restarted head never reuses live ids.
  next_session_ = (rd() & 0x3fffffffu) + 1;
  probe_nonce_ = (static_cast<uint64_t>(rd()) << 32) | rd();
}

void HeadRole::OnClientMessage(uint64_t client, Message& m, ByteCharge charge) {
  if (auto* g = std::get_if<GenerateMsg>(&m)) {
    HandleGenerate(client, *g, std::move(charge));
  } else if (auto* c = std::get_if<CloseMsg>(&m)) {
    auto it = st_.sessions_.find(c->session);
    if (it != st_.sessions_.end() && it->second.client == client && !it->second.closing) {
      EndSession(c->session, wire::FinishReason::kClientClosed, "");
    }
    if (c->count) ClientVouched(c->session, client, *c->count);
  } else if (auto* st = std::get_if<StatsMsg>(&m)) {
    if (!st->records.empty() || !st->drafts.empty()) {
      st_.SendToClient(client, ErrorMsg{wire::ErrorCode::kBadRequest, 0,
                                        "STATS from a client must carry no records"});
      return;
    }
    st_.AddStatsRecord(*st);
    if (ring_closed_ && st_.SendNext(*st)) {
      stats_waiters_.push_back(client);
    } else {
      st_.SendToClient(client, ErrorMsg{wire::ErrorCode::kLinkDown, 0, "the ring is not closed"});
    }
  } else if (auto* p = std::get_if<PingMsg>(&m)) {
    st_.SendToClient(client, PingMsg{true, p->body});
  } else {
    st_.SendToClient(client, ErrorMsg{wire::ErrorCode::kBadRequest, 0,
                                      fmt::format("unexpected {} from a client", MessageName(m))});
  }
}

void HeadRole::OnPredMessage(Message& m) {
  // OPEN_SESSION and HIDDEN that come back are this head's own: only a replay's tells it that the
  // tokens behind it were drawn after the replay.
  if (auto* t = std::get_if<TokenMsg>(&m)) {
    HandleToken(*t);
  } else if (auto* o = std::get_if<OpenSessionMsg>(&m)) {
    if (o->replay) ReplayCameBack(o->session);
  } else if (auto* c = std::get_if<CloseMsg>(&m)) {
    auto it = st_.sessions_.find(c->session);
    if (it != st_.sessions_.end() && it->second.closing) st_.sessions_.erase(it);
  } else if (auto* err = std::get_if<ErrorMsg>(&m)) {
    HandleError(*err);
  } else if (auto* p = std::get_if<PingMsg>(&m)) {
    if (!p->pong && p->body.nonce == probe_nonce_) {
      if (!ring_closed_) KV_LOG_INFO("{}: ring closed", st_.options_.name);
      ring_closed_ = true;
      ReplayHeld();  // sessions held while the ring was broken go first
      std::deque<WaitingGenerate> waiting;
      waiting.swap(waiting_generates_);
      for (WaitingGenerate& w : waiting) StartSession(w.client, w.request);
    }
  } else if (auto* r = std::get_if<ReceiptMsg>(&m)) {
    ReceiptCameBack(*r);
  } else if (auto* st = std::get_if<StatsMsg>(&m)) {
    if (!stats_waiters_.empty()) {
      st_.SendToClient(stats_waiters_.front(), *st);
      stats_waiters_.pop_front();
    }
  }
}

void HeadRole::OnClientGone(uint64_t client) {
  std::vector<uint32_t> ids;
  for (auto& [id, s] : st_.sessions_) {
    if (s.client == client && !s.closing) ids.push_back(id);
  }
  for (uint32_t id : ids) EndSession(id, wire::FinishReason::kClientClosed, "");
  std::erase(stats_waiters_, client);
  std::erase_if(waiting_generates_, [&](const auto& w) { return w.client == client; });
}

void HeadRole::OnSuccUp() {
  ring_closed_ = false;
  last_probe_ = {};
}

void HeadRole::OnRingDown(const std::string& why, bool /*forward*/) {
  ring_closed_ = false;
  for (uint64_t client : stats_waiters_) {
    st_.SendToClient(client, ErrorMsg{wire::ErrorCode::kLinkDown, 0, why});
  }
  stats_waiters_.clear();
}

std::chrono::milliseconds HeadRole::IdleWait() const {
  return std::chrono::milliseconds(ring_closed_ && st_.holds_.empty() ? 1000 : 100);
}

uint32_t HeadRole::client_max_payload() const {
  return MaxClientPayload(MaxPromptBytes(*st_.tokenizer_, st_.window_->n_ctx()));
}

RowSide HeadRole::InputRow(const Work& w, int i) const {
  return TokenRowSide(w.tokens[static_cast<size_t>(i)]);
}

void HeadRole::OnKept(Session& s, PromptCache::Entry& e) {
  e.tokens = std::move(s.history);
  e.tokens.resize(std::min(e.tokens.size(), static_cast<size_t>(e.length)));
  e.n_prompt = s.n_prompt;
}

void HeadRole::OnTurn() {
  SendReceiptsOverdue();
  if (ring_closed_) return;
  const auto now = Clock::now();
  // Sessions held for a repair resume as soon as a probe comes around: probe more often then.
  const auto every = std::chrono::milliseconds(st_.holds_.empty() ? 300 : 50);
  if (now - last_probe_ < every) return;
  last_probe_ = now;
  PingMsg probe{false, {probe_nonce_, 0}};
  st_.SendNext(probe);
}

void HeadRole::FailSession(uint32_t session, wire::ErrorCode /*code*/, const std::string& why) {
  EndSession(session, wire::FinishReason::kError, why);
}

void HeadRole::EndSession(uint32_t session, wire::FinishReason reason, const std::string& error) {
  auto it = st_.sessions_.find(session);
  // A session whose CLOSE is already on its way ends once (one CLOSE, one receipt).
  if (it == st_.sessions_.end() || it->second.closing) return;
  Session& s = it->second;
  st_.KeepOrClose(s, error.empty() ? reason : wire::FinishReason::kError);
  if (!error.empty()) {
    st_.SendToClient(s.client, ErrorMsg{wire::ErrorCode::kBadRequest, session, error});
  }
  KV_LOG_INFO("{}: session {} closed: {} after {} tokens", st_.options_.name, session,
              error.empty() ? wire::FinishReasonName(static_cast<uint8_t>(reason)) : error,
              s.n_generated);
  if (st_.SendNext(CloseMsg{session, static_cast<uint8_t>(reason)})) {
    s.closing = true;  // dropped when the CLOSE comes back around
    SendReceipt(s);    // behind the CLOSE: links keep their order
    return;
  }
  st_.sessions_.erase(it);
}

void HeadRole::HandleGenerate(uint64_t client, GenerateMsg& g, ByteCharge charge) {
  // A refused request is answered with ERROR for session 0; the client's link stays open.
  Status checked = CheckSamplingWire(g.sampling);
  if (checked.ok()) checked = CheckSamplingExtra(g.extra, st_.window_->config().n_vocab);
  if (!checked.ok()) {
    st_.SendToClient(client,
                     ErrorMsg{wire::ErrorCode::kBadRequest, 0, "GENERATE: " + checked.message()});
    return;
  }
  // Stop strings live as long as the session: bounded here, whatever the record limit allowed.
  size_t stop_bytes = 0;
  for (const std::string& stop : g.stops) stop_bytes += sizeof(uint16_t) + stop.size();
  if (stop_bytes > kMaxClientStopBytes) {
    st_.SendToClient(client, ErrorMsg{wire::ErrorCode::kBadRequest, 0,
                                      fmt::format("GENERATE: stop strings of {} bytes exceed this "
                                                  "head's limit of {} bytes",
                                                  stop_bytes, kMaxClientStopBytes)});
    return;
  }
  int open = 0;
  for (const auto& [id, s] : st_.sessions_) {
    open += s.client == client && !s.closing;
  }
  for (const auto& w : waiting_generates_) open += w.client == client;
  if (open >= st_.options_.max_sessions_per_client) {
    st_.SendToClient(client, ErrorMsg{wire::ErrorCode::kBusy, 0,
                                      fmt::format("a client may have {} sessions at once",
                                                  st_.options_.max_sessions_per_client)});
    return;
  }
  if (!ring_closed_) {
    // Starts once the ring probe has gone all the way around.
    if (waiting_generates_.size() >= static_cast<size_t>(st_.options_.max_sessions)) {
      st_.SendToClient(client, ErrorMsg{wire::ErrorCode::kBusy, 0, "the ring is not closed yet"});
      return;
    }
    waiting_generates_.push_back({client, std::move(g), std::move(charge)});
    return;
  }
  StartSession(client, g);
}

void HeadRole::StartSession(uint64_t client, GenerateMsg& g, bool use_cache) {
  const StageOptions& options = st_.options_;
  LayerWindow& window = *st_.window_;
  TraceTiming(options.name, "generate_in", "client={} prompt_bytes={}", client, g.prompt.size());
  auto encoded = EncodePrompt(*st_.tokenizer_, g, window.n_ctx());
  auto refuse = [&](wire::ErrorCode code, const std::string& why) {
    KV_LOG_WARN("{}: refused a request: {}", options.name, why);
    st_.SendToClient(client, ErrorMsg{code, 0, why});
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
  // A one-stage ring: the head samples too (elsewhere, no sampler here).
  auto sampler = st_.exit_->NewSampler(g.sampling, ids, g.extra);
  if (!sampler.ok()) {
    return refuse(wire::ErrorCode::kBadRequest, "GENERATE: " + sampler.status().message());
  }
  std::unique_ptr<TailSampler> tail = std::move(sampler).value();
  // The prompt cache: the kept session whose positions this prompt starts with, taken over.
  PromptCache& cache = st_.cache_;
  uint32_t fork_from = 0;
  int n_cached = 0;
  if (use_cache && cache.budget() > 0) {
    st_.ExpireCache();
    if (auto m = cache.Best(ids, st_.recurrent_);
        m && st_.ForkSequence(m->session, id, m->n_keep)) {
      fork_from = m->session;
      n_cached = m->n_keep;
    }
  }
  if (fork_from == 0) {
    if (Status s = st_.OpenSequence(id); !s.ok()) {
      return refuse(wire::ErrorCode::kBusy, s.message());
    }
  }
  Session& s = st_.sessions_[id];
  s.id = id;
  s.sampling = g.sampling;
  s.n_prompt = static_cast<int>(ids.size());
  s.commit = st_.NewCommit();
  s.client = client;
  s.report_cached = g.report_cached;
  s.client_receipt = g.receipt_id;
  s.keep = cache.budget() > 0;
  s.n_cached = static_cast<uint32_t>(n_cached);
  s.history = ids;  // for the prompt cache, and for a replay
  s.extra = g.extra;
  // A stage may not have kept what this one takes over: then it opens afresh, from the request.
  if (fork_from != 0) s.retry = std::make_unique<GenerateMsg>(g);
  s.stops = StopMatcher(std::move(g.stops));
  s.tail = std::move(tail);
  if (st_.spec_ && s.tail) s.draft = st_.spec_->NewSession(id, s.tail->has_grammar());
  KV_LOG_INFO("{}: session {} open: {} prompt tokens ({} from the prompt cache), up to {} new",
              options.name, id, ids.size(), n_cached, g.sampling.max_tokens);
  TraceTiming(options.name, "open_out", "session={} client={} tokens={} cached={}", id, client,
              ids.size(), n_cached);
  OpenSessionMsg open{id, g.sampling, ids, g.extra};
  open.fork_from = fork_from;
  open.n_cached = static_cast<uint32_t>(n_cached);
  open.keep = s.keep;
  if (!st_.SendNext(open)) {
    EndSession(id, wire::FinishReason::kError, "the link to the next stage is down");
    return;
  }
  // Chunks of near-equal cost, each within options.chunk rows and the cost of as many fresh rows
  // (chunk_plan.h): a cached continuation's rows attend to every cached position, so it is cut
  // and pipelined where a fresh prompt of as many rows is not.
  const RowCost cost = RowCostOf(st_.window_->config(), options.attn_type);
  int pos = n_cached;
  for (const int rows : PlanChunks(cost, n_cached, s.n_prompt - n_cached, options.chunk)) {
    Work w;
    w.session = id;
    w.pos0 = pos;
    w.n_tokens = rows;
    w.tokens.assign(ids.begin() + pos, ids.begin() + pos + w.n_tokens);
    pos += w.n_tokens;
    w.sample = pos == s.n_prompt;
    st_.scheduler_.AddPrefill(std::move(w));
  }
}

void HeadRole::HandleToken(const TokenMsg& t) {
  auto it = st_.sessions_.find(t.token.session);
  if (it == st_.sessions_.end() || it->second.closing) return;
  Session& s = it->second;
  if (t.ahead) {
    // Overlap: the last stage's guess of a later window, fed right behind the chunks before it
    // and never streamed; rows that turn out wrong are dropped before the session's next chunk.
    if (!DrawnBeforeReplay(s)) st_.scheduler_.AddDecode(VerifyChunk(s.id, t));
    return;
  }
  if (!AcceptsToken(s, t)) return;  // held, or drawn before a replay (head_replay.cpp)
  TraceTiming(st_.options_.name, "token_in", "session={} pos={}", s.id, t.token.pos);
  s.n_generated++;
  s.retry.reset();  // every stage has the session: no fallback from here on
  TokenMsg out = PresentToken(t, *st_.tokenizer_, s.n_prompt, &s.stops);
  out.drafts.clear();  // the ring's business, not the client's
  out.more = false;
  if (s.report_cached && s.n_generated == 1) out.n_cached = s.n_cached;
  const bool finished = out.token.finished != 0;
  st_.SendToClient(s.client, out);
  if (finished) {
    EndSession(s.id, static_cast<wire::FinishReason>(out.token.reason), "");
    return;
  }
  s.history.push_back(t.token.id);  // for the prompt cache, and for a replay
  // Speculation: a token decided by a verify chunk with more to follow is in the window already.
  if (t.more) return;
  // Rows rejected before it are dropped when it runs (StageImpl::RollBackBeforeRows).
  st_.scheduler_.AddDecode(VerifyChunk(s.id, t));
}

Work HeadRole::VerifyChunk(uint32_t session, const TokenMsg& t) {
  Work w;
  w.session = session;
  w.pos0 = static_cast<int>(t.token.pos);
  w.n_tokens = 1 + static_cast<int>(t.drafts.size());
  w.sample = true;
  w.verify = !t.drafts.empty();
  w.tokens = {t.token.id};
  w.tokens.insert(w.tokens.end(), t.drafts.begin(), t.drafts.end());
  return w;
}

void HeadRole::HandleError(const ErrorMsg& e) {
  if (e.session == 0) {
    if (e.code == wire::ErrorCode::kLinkDown) st_.RingBroken(e.message, true);
    return;
  }
  if (e.code == wire::ErrorCode::kCacheMiss && RetryWithoutCache(e.session)) return;
  auto it = st_.sessions_.find(e.session);
  if (it != st_.sessions_.end()) {
    Session& s = it->second;
    st_.SendToClient(s.client, ErrorMsg{e.code, e.session, e.message});
    st_.window_->CloseSequence(static_cast<int>(e.session));
    st_.sessions_.erase(it);
    KV_LOG_WARN("{}: session {} failed: {}", st_.options_.name, e.session, e.message);
  }
}

bool HeadRole::RetryWithoutCache(uint32_t session) {
  auto it = st_.sessions_.find(session);
  if (it == st_.sessions_.end() || it->second.retry == nullptr || it->second.n_generated > 0) {
    return false;
  }
  Session& s = it->second;
  KV_LOG_INFO(
      "{}: session {}: a stage had not kept session's state it was to take over: opened "
      "afresh",
      st_.options_.name, session);
  std::unique_ptr<GenerateMsg> request = std::move(s.retry);
  const uint64_t client = s.client;
  st_.window_->CloseSequence(static_cast<int>(session));
  st_.scheduler_.TakeSession(session);
  // Around the ring, so that every stage that took the kept state over frees it.
  if (st_.SendNext(CloseMsg{session, static_cast<uint8_t>(wire::FinishReason::kError)})) {
    s.closing = true;
  } else {
    st_.sessions_.erase(it);
  }
  StartSession(client, *request, /*use_cache=*/false);
  return true;
}

}  // namespace kvasir::ring
