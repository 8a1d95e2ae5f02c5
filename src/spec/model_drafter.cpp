#include "spec/model_drafter.h"

#include <algorithm>

#include "base/check.h"
#include "model/arch/registry.h"
#include "model/sampler.h"

namespace kvasir::spec {

Result<std::unique_ptr<ModelDrafter>> ModelDrafter::Load(const std::string& path,
                                                         int target_n_vocab, int max_tokens,
                                                         int n_threads,
                                                         const std::string& backend) {
  KV_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
  auto shared = std::make_shared<const GgufFile>(std::move(file));
  KV_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(*shared));
  if (cfg.n_vocab != target_n_vocab) {
    return Error(
        "draft model {}: vocabulary of {} tokens, but the model's has {}: a draft model "
        "must share the model's vocabulary",
        path, cfg.n_vocab, target_n_vocab);
  }
  WindowOptions opt;
  opt.n_threads = n_threads;
  opt.backend = backend;
  opt.max_sequences = 1;
  opt.max_checkpoints = std::max(1, max_tokens + 1);
  KV_ASSIGN_OR_RETURN(std::unique_ptr<LayerWindow> w,
                      LayerWindow::Load(shared, {0, cfg.n_layer, true, true}, opt));
  return std::make_unique<ModelDrafter>(std::shared_ptr<LayerWindow>(std::move(w)));
}

ModelDrafter::ModelDrafter(std::shared_ptr<LayerWindow> window, int seq_id)
    : window_(std::move(window)), seq_id_(seq_id) {
  KV_CHECK(window_ != nullptr && window_->spec().has_embed && window_->spec().has_head);
}

ModelDrafter::~ModelDrafter() { window_->CloseSequence(seq_id_); }

// Brings the draft sequence to `history` and leaves the logits after its last token in *out.
Status ModelDrafter::Sync(std::span<const int32_t> history, ForwardOutput* out) {
  if (window_->SequenceLength(seq_id_) < 0) KV_RETURN_IF_ERROR(window_->OpenSequence(seq_id_));
  // Keep the common prefix, but feed at least the last history token again for its logits.
  const size_t common =
      std::mismatch(fed_.begin(), fed_.end(), history.begin(), history.end()).first - fed_.begin();
  int keep = static_cast<int>(std::min(common, history.size() - 1));
  if (keep < static_cast<int>(fed_.size())) {
    // Behind the rollback span (a hybrid draft model after a long rejection): start over.
    if (keep < window_->RollbackFloor(seq_id_)) keep = 0;
    KV_RETURN_IF_ERROR(window_->TruncateSequence(seq_id_, keep));
    fed_.resize(keep);
  }
  ForwardInput in;
  in.chunks = {SeqChunk{seq_id_, keep, static_cast<int>(history.size()) - keep}};
  in.tokens = history.subspan(keep);
  KV_RETURN_IF_ERROR(window_->Forward(in, out));
  fed_.assign(history.begin(), history.end());
  rows_run_ += in.chunks[0].n_tokens;
  return Status::Ok();
}

Result<std::vector<int32_t>> ModelDrafter::Propose(std::span<const int32_t> history,
                                                   int max_tokens) {
  std::vector<int32_t> drafts;
  // The drafts but the last are fed back: history and those must fit the draft's context.
  max_tokens = std::min<int64_t>(max_tokens, window_->n_ctx() + 1 - history.size());
  if (max_tokens <= 0 || history.empty()) return drafts;
  ForwardOutput out;
  KV_RETURN_IF_ERROR(Sync(history, &out).WithContext("draft model"));
  drafts.push_back(ArgMax(out.logits));
  while (static_cast<int>(drafts.size()) < max_tokens) {
    // Each drafted row is checkpointed, so the next call can roll back to any of them.
    SeqChunk ch{seq_id_, static_cast<int>(fed_.size()), 1};
    ch.n_checkpoints = 1;
    ForwardInput in;
    in.chunks = {ch};
    in.tokens = std::span<const int32_t>(&drafts.back(), 1);
    KV_RETURN_IF_ERROR(window_->Forward(in, &out).WithContext("draft model"));
    fed_.push_back(drafts.back());
    ++rows_run_;
    drafts.push_back(ArgMax(out.logits));
  }
  return drafts;
}

}  // namespace kvasir::spec
