// BatchDrafter: one draft model, the drafting sessions of a step batched (batch_drafter.h).
#include "ring/batch_drafter.h"

#include <algorithm>

#include "base/check.h"
#include "model/sampler.h"

namespace kvasir::ring {

BatchDrafter::BatchDrafter(std::shared_ptr<LayerWindow> window) : window_(std::move(window)) {
  KV_CHECK(window_ != nullptr && window_->spec().has_embed && window_->spec().has_head);
}

void BatchDrafter::Close(int seq) {
  window_->CloseSequence(seq);
  fed_.erase(seq);
}

Status BatchDrafter::Propose(std::span<Job* const> jobs) {
  const int n_vocab = window_->config().n_vocab;
  // Bring every job's sequence to its history, feeding at least its last token again for the
  // logits that give the first draft.
  std::vector<Job*> live;
  std::vector<int32_t> tokens;  // [rows] the fed ids
  ForwardInput in;
  for (Job* job : jobs) {
    job->drafts.clear();
    // The drafts but the last are fed back: history and those must fit the context.
    job->k = static_cast<int>(std::min<int64_t>(
        job->k, window_->n_ctx() + 1 - static_cast<int64_t>(job->history.size())));
    if (job->k <= 0 || job->history.empty()) continue;
    if (window_->SequenceLength(job->seq) < 0) {
      KV_RETURN_IF_ERROR(window_->OpenSequence(job->seq));
      fed_[job->seq].clear();
    }
    std::vector<int32_t>& fed = fed_[job->seq];
    const size_t common =
        std::mismatch(fed.begin(), fed.end(), job->history.begin(), job->history.end()).first -
        fed.begin();
    int keep = static_cast<int>(std::min(common, job->history.size() - 1));
    if (keep < static_cast<int>(fed.size())) {
      // Behind the rollback span (a hybrid draft model after a long rejection): start over.
      if (keep < window_->RollbackFloor(job->seq)) keep = 0;
      KV_RETURN_IF_ERROR(window_->TruncateSequence(job->seq, keep));
      fed.resize(static_cast<size_t>(keep));
    }
    in.chunks.push_back(SeqChunk{job->seq, keep, static_cast<int>(job->history.size()) - keep});
    tokens.insert(tokens.end(), job->history.begin() + keep, job->history.end());
    live.push_back(job);
  }
  if (live.empty()) return Status::Ok();
  ForwardOutput out;
  in.tokens = tokens;
  KV_RETURN_IF_ERROR(window_->Forward(in, &out).WithContext("draft model"));
  for (size_t i = 0; i < live.size(); ++i) {
    fed_[live[i]->seq].assign(live[i]->history.begin(), live[i]->history.end());
    live[i]->drafts.push_back(
        ArgMax(std::span<const float>(out.logits).subspan(i * n_vocab, n_vocab)));
  }
  // One pass per drafted position over the jobs that want more; each row is checkpointed, so a
  // later call can roll back to any of them.
  while (true) {
    std::erase_if(live, [](const Job* j) { return static_cast<int>(j->drafts.size()) >= j->k; });
    if (live.empty()) return Status::Ok();
    in.chunks.clear();
    tokens.clear();
    for (Job* job : live) {
      SeqChunk ch{job->seq, static_cast<int>(fed_[job->seq].size()), 1};
      ch.n_checkpoints = 1;
      in.chunks.push_back(ch);
      tokens.push_back(job->drafts.back());
    }
    in.tokens = tokens;
    KV_RETURN_IF_ERROR(window_->Forward(in, &out).WithContext("draft model"));
    for (size_t i = 0; i < live.size(); ++i) {
      fed_[live[i]->seq].push_back(live[i]->drafts.back());
      live[i]->drafts.push_back(
          ArgMax(std::span<const float>(out.logits).subspan(i * n_vocab, n_vocab)));
    }
  }
}

}  // namespace kvasir::ring
