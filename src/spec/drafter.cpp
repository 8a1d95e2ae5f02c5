#include "spec/drafter.h"

#include "spec/model_drafter.h"
#include "spec/mtp_drafter.h"
#include "spec/ngram_drafter.h"

namespace kvasir::spec {

Result<DraftKind> ParseDraftKind(const std::string& text) {
  if (text == "none") return DraftKind::kNone;
  if (text == "ngram") return DraftKind::kNgram;
  if (text == "model") return DraftKind::kModel;
  if (text == "mtp") return DraftKind::kMtp;
  if (text == "auto") return DraftKind::kAuto;
  return Error("--draft {}: not a drafter (choose auto, mtp, ngram, model or none)", text);
}

Result<std::unique_ptr<Drafter>> MakeDrafter(const DraftOptions& o, LayerWindow& target) {
  if (o.max_tokens < 0 || o.max_tokens > 64) {
    return Error("--draft-max {}: drafts of 0..64 tokens are supported", o.max_tokens);
  }
  DraftKind kind = o.kind;
  if (kind == DraftKind::kAuto) {
    kind = !o.model_path.empty() ? DraftKind::kModel
           : target.has_nextn()  ? DraftKind::kMtp
                                 : DraftKind::kNgram;
  }
  if (kind == DraftKind::kMtp && !target.has_nextn()) {
    return Error(
        "--draft mtp needs the model's own multi-token-prediction block (nextn_predict_layers), "
        "which {} ({}) does not have",
        target.config().name.empty() ? "the model" : target.config().name, target.config().arch);
  }
  if (kind == DraftKind::kModel && o.model_path.empty()) {
    return Error("--draft model needs --draft-model FILE (a GGUF sharing the model's vocabulary)");
  }
  if (kind != DraftKind::kModel && !o.model_path.empty() && o.kind != DraftKind::kAuto) {
    return Error("--draft-model goes with --draft model or auto");
  }
  if (kind == DraftKind::kNone || o.max_tokens == 0) return std::unique_ptr<Drafter>();
  if (kind == DraftKind::kNgram) return std::unique_ptr<Drafter>(std::make_unique<NgramDrafter>());
  if (kind == DraftKind::kMtp) {
    return std::unique_ptr<Drafter>(std::make_unique<MtpDrafter>(target, o.seq_id));
  }
  KV_ASSIGN_OR_RETURN(std::unique_ptr<ModelDrafter> d,
                      ModelDrafter::Load(o.model_path, target.config().n_vocab, o.max_tokens,
                                         o.n_threads, o.backend));
  return std::unique_ptr<Drafter>(std::move(d));
}

}  // namespace kvasir::spec
