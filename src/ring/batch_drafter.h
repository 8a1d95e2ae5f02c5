// A draft model shared by the sessions of a ring's last stage. Each session's drafts are what
// spec::ModelDrafter makes (greedy, one row per drafted token, the session's sequence in the draft
// window kept in step with its history by rollback), but the sessions that draft at the same time
// run together: one forward pass brings them all up to their histories, then one pass per drafted
// position. Rows of a batch give the bits they give alone, so batching changes no draft; eight
// sessions cost a few batched passes instead of eight times as many single rows. Compute thread
// only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "model/layer_window.h"

namespace kvasir::ring {

class BatchDrafter {
 public:
  // `window`: a whole model (embeddings and head).
  explicit BatchDrafter(std::shared_ptr<LayerWindow> window);

  // One session's request: up to `k` drafts to follow `history` (which outlives the call), on
  // draft sequence `seq`.
  struct Job {
    int seq = 0;
    std::span<const int32_t> history;
    int k = 0;
    std::vector<int32_t> drafts;  // out
  };
  // Drafts for every job (fewer when the context ends first). An error of the draft window fails
  // the whole call (the jobs then draft nothing).
  Status Propose(std::span<Job* const> jobs);
  // Frees sequence `seq` (its session ended).
  void Close(int seq);

 private:
  std::shared_ptr<LayerWindow> window_;
  std::unordered_map<int, std::vector<int32_t>> fed_;  // per sequence: the tokens in the window
};

}  // namespace kvasir::ring
