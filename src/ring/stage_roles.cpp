// The roles of a ring member that is not the head (MemberEntry) and not the last stage
// (MemberExit), and the choice of a stage's roles (stage_roles.h).
#include "ring/stage_roles.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/log.h"
#include "base/timing_trace.h"
#include "ring/head_role.h"
#include "ring/link_limits.h"
#include "ring/sampling_wire.h"
#include "ring/stage_impl.h"
#include "ring/tail_role.h"
#include "ring/test_fault.h"

namespace kvasir::ring {

std::unique_ptr<EntryRole> MakeEntryRole(StageImpl& stage, bool has_embed) {
  if (has_embed) return std::make_unique<HeadRole>(stage);
  return std::make_unique<MemberEntry>(stage);
}

std::unique_ptr<ExitRole> MakeExitRole(StageImpl& stage, bool has_head) {
  if (has_head) return std::make_unique<TailRole>(stage);
  return std::make_unique<MemberExit>(stage);
}

uint32_t MemberEntry::client_max_payload() const { return MaxClientPayload(0); }

void MemberEntry::OnPredMessage(Message& m) {
  // A ring member: handles what concerns its window, and passes everything on.
  if (auto* o = std::get_if<OpenSessionMsg>(&m)) {
    st_.HandleOpen(*o);
  } else if (auto* h = std::get_if<HiddenMsg>(&m)) {
    st_.HandleHidden(*h);
  } else if (auto* t = std::get_if<TokenMsg>(&m)) {
    st_.SendNext(*t);
  } else if (auto* c = std::get_if<CloseMsg>(&m)) {
    st_.HandleClose(*c);
  } else if (auto* err = std::get_if<ErrorMsg>(&m)) {
    st_.HandleError(*err);
  } else if (auto* p = std::get_if<PingMsg>(&m)) {
    st_.SendNext(*p);
  } else if (auto* r = std::get_if<ReceiptMsg>(&m)) {
    SignReceipt(*r);
  } else if (auto* st = std::get_if<StatsMsg>(&m)) {
    if (st->records.size() >= wire::kMaxStatsRecords) {
      KV_LOG_WARN("{}: STATS with {} records dropped (a ring has at most {} stages)",
                  st_.options_.name, st->records.size(), wire::kMaxStatsRecords);
    } else {
      st_.AddStatsRecord(*st);
      st_.SendNext(*st);
    }
  }
}

void MemberEntry::OnRingDown(const std::string& why, bool forward) {
  // Toward the head, which replays once the ring is whole again.
  if (forward) st_.SendNext(ErrorMsg{wire::ErrorCode::kLinkDown, 0, why});
}

void MemberEntry::FailSession(uint32_t session, wire::ErrorCode code, const std::string& why) {
  st_.window_->CloseSequence(static_cast<int>(session));
  st_.sessions_.erase(session);
  st_.SendNext(ErrorMsg{code, session, why});
}

void MemberEntry::SignReceipt(ReceiptMsg& m) {
  auto signed_payload = st_.receipts_.Sign(m.payload);
  if (!signed_payload.ok()) {
    KV_LOG_WARN("{}: {}", st_.options_.name, signed_payload.status().message());
    return;
  }
  st_.SendNext(ReceiptMsg{std::move(*signed_payload)});
}

void MemberEntry::TakeToken(const TokenMsg& t) {
  TraceTiming(st_.options_.name, "token_out", "session={} pos={}", t.token.session, t.token.pos);
  st_.SendNext(t);
}

RowSide MemberEntry::InputRow(const Work& w, int i) const {
  // [n_tokens, n_embd] f32: the values this window computed on.
  const size_t n_embd = static_cast<size_t>(st_.window_->config().n_embd);
  return F32RowSide(
      std::span<const float>(w.hidden).subspan(static_cast<size_t>(i) * n_embd, n_embd));
}

Result<std::unique_ptr<TailSampler>> MemberExit::NewSampler(const wire::SamplingWire&,
                                                            std::vector<int32_t>,
                                                            const SamplingExtra&) {
  return std::unique_ptr<TailSampler>();  // the last stage draws the tokens
}

Result<std::unique_ptr<TailSampler>> MemberExit::CheckOpen(const OpenSessionMsg& o) {
  const LayerWindow& window = *st_.window_;
  KV_RETURN_IF_ERROR(
      CheckSessionRequest(o.sampling, o.prompt, window.n_ctx(), window.config().n_vocab, o.extra));
  return std::unique_ptr<TailSampler>();
}

void MemberExit::EmitOutputs(std::span<const Work> batch, const ForwardOutput& out) {
  const StageOptions& options = st_.options_;
  const int n_embd = st_.window_->config().n_embd;
  std::span<const float> hidden = out.hidden;
  std::vector<float> noisy;  // test builds: the rows perturbed (ring/test_fault.h)
  if (options.test_fault_noise > 0) {
    noisy = out.hidden;
    AddTestFaultNoise(noisy, static_cast<size_t>(n_embd), options.test_fault_noise);
    hidden = noisy;
  }
  size_t row = 0;
  for (const Work& w : batch) {
    HiddenMsg h =
        MakeHidden(w.session, static_cast<uint32_t>(w.pos0), static_cast<uint32_t>(w.n_tokens),
                   static_cast<uint32_t>(n_embd), options.boundary,
                   static_cast<uint16_t>((w.sample ? wire::kHiddenSample : 0) |
                                         (w.verify ? wire::kHiddenVerify : 0)),
                   hidden.subspan(row * n_embd, static_cast<size_t>(w.n_tokens) * n_embd));
    st_.CommitRows(w, &h, std::nullopt);
    TraceTiming(options.name, "hidden_out", "session={} pos0={} rows={}", w.session, w.pos0,
                w.n_tokens);
    st_.replay_rows_.Add(h);
    st_.SendNext(h);
    row += w.n_tokens;
  }
}

int MemberExit::ReplayKeepLimit(const Session& s, int /*n*/) const {
  // What it cannot send on, it runs again.
  return static_cast<int>(st_.replay_rows_.kept(s.id));
}

bool MemberExit::PassKept(Session& s, const HiddenMsg& h, const Work& w, uint32_t upto) {
  if (st_.replay_rows_.kept(s.id) < upto) {
    st_.FailSession(s.id, wire::ErrorCode::kBusy,
                    fmt::format("replay: the rows kept for positions {}..{} were given up for "
                                "--replay-mb's budget",
                                h.pos0, upto));
    return false;
  }
  const uint32_t end = h.pos0 + h.n_tokens;
  const uint16_t flags = upto == end ? h.flags : 0;
  const HiddenMsg kept = st_.replay_rows_.Rows(s.id, h.pos0, upto - h.pos0, flags);
  st_.CommitRows(w, &kept, std::nullopt);
  return st_.SendNext(kept);
}

}  // namespace kvasir::ring
