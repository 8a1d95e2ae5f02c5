// SpecTail: drafting and verifying at the last stage (spec_tail.h).
#include "ring/spec_tail.h"

#include <algorithm>

#include "base/log.h"
#include "gguf/gguf_file.h"
#include "model/arch/registry.h"
#include "ring/wire.h"
#include "spec/mtp_drafter.h"
#include "spec/ngram_drafter.h"

namespace kvasir::ring {

Result<std::unique_ptr<SpecTail>> SpecTail::Create(const spec::DraftOptions& o,
                                                   LayerWindow& target) {
  if (o.max_tokens < 0 || o.max_tokens > static_cast<int>(wire::kMaxDraftTokens)) {
    return Error("--draft-max {}: drafts of 0..{} tokens are supported", o.max_tokens,
                 wire::kMaxDraftTokens);
  }
  spec::DraftKind kind = o.kind;
  if (kind == spec::DraftKind::kAuto) {
    kind = !o.model_path.empty() ? spec::DraftKind::kModel
           : target.has_nextn()  ? spec::DraftKind::kMtp
                                 : spec::DraftKind::kNgram;
  }
  if (kind == spec::DraftKind::kMtp && !target.has_nextn()) {
    return Error(
        "--draft mtp needs the model's own multi-token-prediction block (nextn_predict_layers) "
        "in the last stage's window, which {} ({}) does not have",
        target.config().name.empty() ? "the model" : target.config().name, target.config().arch);
  }
  if (kind == spec::DraftKind::kModel && o.model_path.empty()) {
    return Error("--draft model needs --draft-model FILE (a GGUF sharing the model's vocabulary)");
  }
  if (kind != spec::DraftKind::kModel && !o.model_path.empty()) {
    return Error("--draft-model goes with --draft model or auto");
  }
  if (o.windows < 1 || o.windows > kMaxDraftWindows) {
    return Error("--draft-windows {}: 1..{} verify windows in flight are supported", o.windows,
                 kMaxDraftWindows);
  }
  // A verify chunk of K + 1 rows needs K + 1 checkpoints on every stage.
  const int max_tokens = std::min(o.max_tokens, target.max_checkpoints() - 1);
  if (kind == spec::DraftKind::kNone || max_tokens <= 0) return std::unique_ptr<SpecTail>();
  std::shared_ptr<LayerWindow> draft_window;
  if (kind == spec::DraftKind::kModel) {
    KV_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(o.model_path));
    auto shared = std::make_shared<const GgufFile>(std::move(file));
    KV_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(*shared));
    if (cfg.n_vocab != target.config().n_vocab) {
      return Error(
          "draft model {}: vocabulary of {} tokens, but the model's has {}: a draft model must "
          "share the model's vocabulary",
          o.model_path, cfg.n_vocab, target.config().n_vocab);
    }
    WindowOptions wopt;
    wopt.n_ctx = target.n_ctx();
    wopt.n_threads = o.n_threads;
    wopt.backend = o.backend;
    // Drafting ahead runs up to 2K + 1 rows past what is decided (with overlap, K + 1 more per
    // window), all of which a miss undoes.
    wopt.max_checkpoints = (std::max(o.windows, 1) + 1) * (max_tokens + 1);
    KV_ASSIGN_OR_RETURN(std::unique_ptr<LayerWindow> w,
                        LayerWindow::Load(shared, {0, cfg.n_layer, true, true}, wopt));
    draft_window = std::move(w);
  }
  spec::DraftOptions options = o;
  options.kind = kind;
  return std::unique_ptr<SpecTail>(new SpecTail(
      options, max_tokens,
      draft_window ? std::make_shared<BatchDrafter>(std::move(draft_window)) : nullptr, &target));
}

SpecTail::SpecTail(const spec::DraftOptions& options, int max_tokens,
                   std::shared_ptr<BatchDrafter> model, LayerWindow* target)
    : options_(options),
      max_tokens_(max_tokens),
      model_(std::move(model)),
      target_(target),
      name_(options.kind == spec::DraftKind::kModel ? "model"
            : options.kind == spec::DraftKind::kMtp ? "mtp"
                                                    : "ngram") {}

std::unique_ptr<SessionDraft> SpecTail::NewSession(uint32_t session, bool has_grammar) {
  if (has_grammar) return nullptr;
  auto d = std::make_unique<SessionDraft>();
  if (model_) {
    d->model = model_;
    // Session ids are below 2^31 (the head draws them from 30 bits and counts up).
    d->seq = static_cast<int>(session);
  } else if (options_.kind == spec::DraftKind::kMtp) {
    // The stage's sequence of the session, whose nextn cache opens and closes with it.
    d->drafter = std::make_unique<spec::MtpDrafter>(*target_, static_cast<int>(session));
  } else {
    d->drafter = std::make_unique<spec::NgramDrafter>();
  }
  d->budget = spec::DraftBudget(max_tokens_);
  return d;
}

Result<std::vector<TokenMsg>> SpecTail::Verify(uint32_t session, TailSampler& sampler,
                                               SessionDraft& d, int pos0, int n_tokens,
                                               std::span<const float> logits, int n_vocab,
                                               int n_ctx,
                                               const std::function<bool(int32_t)>& is_eog) {
  if (!d.stale.empty() && d.stale.front().pos0 == pos0 &&
      static_cast<int>(d.stale.front().rows.size()) == n_tokens) {
    d.stale.pop_front();  // a guess before it failed: these rows are dropped with the next chunk
    return std::vector<TokenMsg>();
  }
  const int k = static_cast<int>(d.pending.size());
  if (pos0 != d.pending_pos || n_tokens != k + 1) {
    return Error("a verify chunk of {} rows at position {}, but {} drafts follow position {}",
                 n_tokens, pos0, k, d.pending_pos);
  }
  auto row = [&](int i) { return logits.subspan(static_cast<size_t>(i) * n_vocab, n_vocab); };
  std::vector<TokenMsg> decided;
  int accepted = 0;
  bool rejected = false;
  for (int i = 0; i < k; ++i) {
    bool ok = false;
    KV_ASSIGN_OR_RETURN(TokenMsg t, sampler.Verify(session, row(i), d.pending[i], pos0 + 1 + i,
                                                   n_ctx, is_eog, &ok));
    accepted += ok ? 1 : 0;
    const bool finished = t.token.finished != 0;
    decided.push_back(std::move(t));
    if (!ok) rejected = true;
    if (!ok || finished) break;
  }
  if (!rejected && decided.size() == static_cast<size_t>(k) &&
      (decided.empty() || decided.back().token.finished == 0)) {
    // Every draft taken: the last row gives one more token.
    KV_ASSIGN_OR_RETURN(TokenMsg t, sampler.Sample(session, row(k), pos0 + 1 + k, n_ctx, is_eog));
    decided.push_back(std::move(t));
  }
  for (size_t i = 0; i + 1 < decided.size(); ++i) decided[i].more = true;
  d.kept_rows = accepted + 1;
  d.budget.Record(k, accepted);
  d.pending.clear();
  d.pending_pos = -1;
  if (!d.further.empty()) {
    // The window behind was guessed on every draft taken and this chunk's last token: it holds
    // when that came true, and then the token is in the ring already.
    SessionDraft::Window& next = d.further.front();
    const TokenMsg& last = decided.back();
    if (!rejected && last.token.finished == 0 && next.pos0 == static_cast<int>(last.token.pos) &&
        next.rows.front() == last.token.id) {
      decided.back().more = true;
      d.pending.assign(next.rows.begin() + 1, next.rows.end());
      d.pending_pos = next.pos0;
      d.further.pop_front();
      confirmed_.fetch_add(1);
    } else {
      for (SessionDraft::Window& w : d.further) d.stale.push_back(std::move(w));
      d.further.clear();
    }
  }
  steps_.fetch_add(1);
  drafted_.fetch_add(static_cast<uint64_t>(k));
  accepted_.fetch_add(static_cast<uint64_t>(accepted));
  return decided;
}

void SpecTail::LookAhead(TailSampler& sampler, SessionDraft& d) {
  if (!d.warmed) {
    d.warmed = true;
    // Runs the prompt through the draft model; the next Propose feeds only what follows it.
    (void)ProposeOne(d, sampler.history(), 1);
    return;
  }
  d.looked_ahead = true;
  d.expect = sampler.history();
  d.expect.insert(d.expect.end(), d.pending.begin(), d.pending.end());
  auto next = ProposeOne(d, d.expect, max_tokens_ + 1);
  if (!next.ok() || next->size() < 2) {
    d.expect.clear();
    return;
  }
  d.expect.push_back(next->front());
  d.ahead.assign(next->begin() + 1, next->end());
}

void SpecTail::DraftFurther(uint32_t session, TailSampler& sampler, SessionDraft& d,
                            const wire::SamplingWire& sampling, int n_ctx,
                            std::vector<TokenMsg>* out) {
  const FurtherJob job{session, &sampler, &d, &sampling, out};
  DraftFurtherAll(std::span<const FurtherJob>(&job, 1), n_ctx);
}

void SpecTail::DraftFurtherAll(std::span<const FurtherJob> jobs, int n_ctx) {
  if (options_.windows <= 1 || wants_hidden()) return;
  struct Plan {
    const FurtherJob* job = nullptr;
    int k = 0;
    int rows = 0;  // rows in flight past the pending window's first, which is decided
    int room = 0;  // drafts the next window may have
    // The history if every window in flight is accepted whole, each followed by the next's token.
    std::vector<int32_t> guess;
    BatchDrafter::Job model_job;
  };
  std::vector<Plan> plans;
  for (const FurtherJob& j : jobs) {
    const SessionDraft& d = *j.d;
    if (d.pending.empty() || d.budget.acceptance() < options_.overlap_min_acceptance) continue;
    if (static_cast<int>(j.sampler->history().size()) != d.pending_pos + 1) continue;
    Plan p;
    p.job = &j;
    p.k = static_cast<int>(d.pending.size());
    p.guess = j.sampler->history();
    p.guess.insert(p.guess.end(), d.pending.begin(), d.pending.end());
    p.rows = p.k;
    for (const SessionDraft::Window& w : d.further) {
      p.guess.insert(p.guess.end(), w.rows.begin(), w.rows.end());
      p.rows += static_cast<int>(w.rows.size());
    }
    plans.push_back(std::move(p));
  }
  // One window more per session and round; a draft model's sessions run as one batch.
  while (true) {
    std::vector<Plan*> round;
    std::vector<BatchDrafter::Job*> batch;
    for (Plan& p : plans) {
      const FurtherJob& j = *p.job;
      if (1 + static_cast<int>(j.d->further.size()) >= options_.windows) continue;
      const int pos0 = static_cast<int>(p.guess.size());
      // Tokens the session will have generated with the guessed one at pos0; the drafts after
      // it must leave room for one more within max_tokens and the context.
      const int64_t generated = j.sampler->n_generated() + (pos0 - j.d->pending_pos);
      const int64_t left = static_cast<int64_t>(j.sampling->max_tokens) - generated;
      p.room = static_cast<int>(std::min<int64_t>(
          {p.k, n_ctx - pos0 - 1, left - 1, target_->max_checkpoints() - p.rows - 1}));
      if (p.room <= 0) continue;
      round.push_back(&p);
      p.model_job = BatchDrafter::Job{j.d->seq, p.guess, p.room + 1, {}};
      if (j.d->model) batch.push_back(&p.model_job);
    }
    if (round.empty()) return;
    if (!batch.empty()) {
      if (Status st = model_->Propose(batch); !st.ok()) {
        KV_LOG_WARN("drafting ahead failed for {} session(s): {}", batch.size(), st.message());
        return;
      }
    }
    bool any = false;
    for (Plan* p : round) {
      const FurtherJob& j = *p->job;
      SessionDraft& d = *j.d;
      std::vector<int32_t> rows;
      if (d.model) {
        rows = std::move(p->model_job.drafts);
      } else if (auto r = d.drafter->Propose(p->guess, p->room + 1); r.ok()) {
        rows = std::move(r).value();
      }
      p->model_job = {};
      if (rows.size() < 2) {
        p->room = 0;
        p->k = 0;  // no guess: no window after it either
        continue;
      }
      if (static_cast<int>(rows.size()) > p->room + 1)
        rows.resize(static_cast<size_t>(p->room + 1));
      SessionDraft::Window w{static_cast<int>(p->guess.size()), std::move(rows)};
      TokenMsg m;
      m.token.session = j.session;
      m.token.pos = static_cast<uint32_t>(w.pos0);
      m.token.id = w.rows.front();
      m.drafts.assign(w.rows.begin() + 1, w.rows.end());
      m.ahead = true;
      j.out->push_back(std::move(m));
      p->guess.insert(p->guess.end(), w.rows.begin(), w.rows.end());
      p->rows += static_cast<int>(w.rows.size());
      d.further.push_back(std::move(w));
      guessed_.fetch_add(1);
      d.looked_ahead = true;  // the window behind is drafted already
      any = true;
    }
    if (!any) return;
  }
}

Result<std::vector<int32_t>> SpecTail::ProposeOne(SessionDraft& d, std::span<const int32_t> history,
                                                  int k) {
  if (!d.model) return d.drafter->Propose(history, k);
  BatchDrafter::Job job{d.seq, history, k, {}};
  BatchDrafter::Job* jobs[] = {&job};
  KV_RETURN_IF_ERROR(d.model->Propose(jobs));
  return std::move(job.drafts);
}

void SpecTail::Draft(TailSampler& sampler, SessionDraft& d, const wire::SamplingWire& sampling,
                     int n_ctx, TokenMsg* last) {
  const DraftJob job{&sampler, &d, &sampling, last};
  DraftAll(std::span<const DraftJob>(&job, 1), n_ctx);
}

void SpecTail::DraftAll(std::span<const DraftJob> jobs, int n_ctx) {
  struct Plan {
    int k = 0;
    std::vector<int32_t> drafts;
    BatchDrafter::Job job;
  };
  std::vector<Plan> plans(jobs.size());  // sized once: the batch points into it
  std::vector<BatchDrafter::Job*> batch;
  for (size_t i = 0; i < jobs.size(); ++i) {
    TailSampler& sampler = *jobs[i].sampler;
    SessionDraft& d = *jobs[i].d;
    std::vector<int32_t> ahead;
    if (!d.ahead.empty() && sampler.history() == d.expect) ahead = std::move(d.ahead);
    d.looked_ahead = false;
    d.expect.clear();
    d.ahead.clear();
    d.pending.clear();
    d.pending_pos = -1;
    const int pos = static_cast<int>(jobs[i].last->token.pos);
    // The verify chunk takes positions pos..pos+K, and a token past max_tokens would be wasted.
    const int64_t left = static_cast<int64_t>(jobs[i].sampling->max_tokens) - sampler.n_generated();
    const int room = static_cast<int>(
        std::min<int64_t>({max_tokens_, n_ctx - pos - 1, std::max<int64_t>(left - 1, 0)}));
    if (room <= 0) continue;
    const int k = std::min(d.budget.Next(), room);
    if (k <= 0) continue;
    plans[i].k = k;
    // Drafts are a prefix-closed function of the history: the first k of those made ahead are
    // the k that Propose would make now.
    if (static_cast<int>(ahead.size()) >= k) {
      plans[i].drafts = std::move(ahead);
    } else if (d.model) {
      plans[i].job = BatchDrafter::Job{d.seq, sampler.history(), k, {}};
      batch.push_back(&plans[i].job);
    } else if (auto drafts = d.drafter->Propose(sampler.history(), k); drafts.ok()) {
      plans[i].drafts = std::move(drafts).value();
    } else {
      KV_LOG_WARN("session {}: drafting failed, continuing without: {}",
                  jobs[i].last->token.session, drafts.status().message());
    }
  }
  if (!batch.empty()) {
    if (Status st = model_->Propose(batch); st.ok()) {
      for (Plan& p : plans) {
        if (!p.job.drafts.empty()) p.drafts = std::move(p.job.drafts);
      }
    } else {
      KV_LOG_WARN("drafting failed for {} session(s), continuing without: {}", batch.size(),
                  st.message());
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    std::vector<int32_t>& out = plans[i].drafts;
    if (static_cast<int>(out.size()) > plans[i].k) out.resize(static_cast<size_t>(plans[i].k));
    if (out.empty()) continue;
    jobs[i].d->pending = out;
    jobs[i].d->pending_pos = static_cast<int>(jobs[i].last->token.pos);
    jobs[i].last->drafts = std::move(out);
  }
}

void SpecTail::ObserveHidden(SessionDraft& d, int pos0, std::span<const float> rows) {
  if (d.drafter != nullptr && d.drafter->wants_hidden()) d.drafter->ObserveHidden(pos0, rows);
}

DraftTotals SpecTail::counts() const {
  return DraftTotals{name_,           steps_.load(),    drafted_.load(), accepted_.load(),
                     guessed_.load(), confirmed_.load()};
}

}  // namespace kvasir::ring
