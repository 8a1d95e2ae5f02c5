// A draft model: a small GGUF that shares the target's vocabulary, run as a whole-model window of
// its own. It drafts greedily (its argmax), one row per token, and keeps its sequence in step with
// the session's history across calls: rows of rejected drafts are rolled back (within the window's
// rollback span, so hybrid draft models work too), and only the new history rows are fed.
#pragma once

#include <memory>
#include <vector>

#include "spec/drafter.h"

namespace kvasir::spec {

class ModelDrafter final : public Drafter {
 public:
  // Loads `path` as a whole-model window that keeps up to max_tokens + 1 checkpoints. Refuses a
  // file that does not load, or one whose n_vocab is not target_n_vocab (naming both).
  static Result<std::unique_ptr<ModelDrafter>> Load(const std::string& path, int target_n_vocab,
                                                    int max_tokens, int n_threads,
                                                    const std::string& backend);
  // Drafts with `window` (a whole model with head and embeddings), on its sequence `seq_id`,
  // which it opens and closes. Several drafters (one per session) may share a window, each on its
  // own sequence, from one thread.
  explicit ModelDrafter(std::shared_ptr<LayerWindow> window, int seq_id = 0);
  ~ModelDrafter() override;

  const char* name() const override { return "model"; }
  Result<std::vector<int32_t>> Propose(std::span<const int32_t> history, int max_tokens) override;

  // Rows the draft window has run (fed history and drafted tokens), for tests and statistics.
  int64_t rows_run() const { return rows_run_; }

 private:
  Status Sync(std::span<const int32_t> history, ForwardOutput* out);

  std::shared_ptr<LayerWindow> window_;
  int seq_id_;
  std::vector<int32_t> fed_;  // the tokens in the draft window's sequence, in order
  int64_t rows_run_ = 0;
};

}  // namespace kvasir::spec
