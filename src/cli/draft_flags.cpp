#include "cli/draft_flags.h"

#include <CLI/CLI.hpp>
#include <filesystem>

#include "model/model_config.h"
#include "ring/spec_tail.h"
#include "ring/wire.h"

namespace kvasir::cli {

void AddDraftFlags(CLI::App& app, DraftFlags* flags) {
  app.add_option(
         "--draft", flags->kind,
         "speculation on the ring's last stage: mtp (the model's own multi-token-prediction "
         "block, in the last stage's window), ngram (prompt lookup), model "
         "(--draft-model), auto (model when --draft-model is given, else mtp when the "
         "model has a nextn block, else ngram) or none")
      ->capture_default_str();
  app.add_option("--draft-model", flags->model,
                 "a small GGUF sharing the model's vocabulary, loaded by the last stage to draft");
  app.add_option("--draft-max", flags->max_tokens,
                 "tokens drafted after each token (K; each verify chunk runs K + 1 rows); lowered "
                 "per session while drafts are rejected")
      ->capture_default_str();
  app.add_option("--draft-windows", flags->windows,
                 "verify windows of a session in flight at once: past the first, each is drafted "
                 "on the guess that the windows before it are accepted whole (dropped on a miss); "
                 "sent while the session's drafts are mostly accepted")
      ->capture_default_str();
}

Result<spec::DraftOptions> CheckDraftFlags(const DraftFlags& f) {
  spec::DraftOptions o;
  KV_ASSIGN_OR_RETURN(o.kind, spec::ParseDraftKind(f.kind));
  if (f.max_tokens < 0 || f.max_tokens > static_cast<int>(wire::kMaxDraftTokens)) {
    return Error("--draft-max {}: must be from 0 to {}", f.max_tokens, wire::kMaxDraftTokens);
  }
  if (o.kind == spec::DraftKind::kModel && f.model.empty()) {
    return Error("--draft model needs --draft-model FILE (a GGUF sharing the model's vocabulary)");
  }
  if (!f.model.empty()) {
    if (o.kind != spec::DraftKind::kModel && o.kind != spec::DraftKind::kAuto) {
      return Error("--draft-model goes with --draft model or auto");
    }
    std::error_code ec;
    if (!std::filesystem::is_regular_file(f.model, ec)) {
      return Error("--draft-model {}: no such file", f.model);
    }
  }
  if (f.windows < 1 || f.windows > ring::kMaxDraftWindows) {
    return Error("--draft-windows {}: must be from 1 to {}", f.windows, ring::kMaxDraftWindows);
  }
  o.windows = f.windows;
  o.model_path = f.model;
  o.max_tokens = f.max_tokens;
  return o;
}

Status CheckDraftForModel(const DraftFlags& f, const ModelConfig& cfg) {
  if (f.kind != "mtp" || cfg.n_layer_nextn > 0) return Status::Ok();
  return Error(
      "--draft mtp needs the model's own multi-token-prediction block (nextn_predict_layers), "
      "which {} ({}) does not have",
      cfg.name.empty() ? "the model" : cfg.name, cfg.arch);
}

std::vector<std::string> DraftStageArgs(const DraftFlags& f) {
  if (f.kind == "none") return {};
  std::vector<std::string> args = {"--draft",         f.kind,
                                   "--draft-max",     std::to_string(f.max_tokens),
                                   "--draft-windows", std::to_string(f.windows)};
  if (!f.model.empty()) args.insert(args.end(), {"--draft-model", f.model});
  return args;
}

}  // namespace kvasir::cli
