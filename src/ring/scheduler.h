// A stage's work queues and how its next forward batch is formed. Pure: no links, no model, so
// every ordering rule is tested alone (tests/ring/scheduler_test.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/layer_window.h"

namespace kvasir::ring {

// A batch item: rows of one session that this stage runs next.
struct Work {
  uint32_t session = 0;
  int pos0 = 0;
  int n_tokens = 0;
  bool sample = false;
  // A verify chunk (wire::kHiddenVerify): a token and its drafts; every row is checkpointed, and
  // on the last stage every row gives logits.
  bool verify = false;
  std::vector<int32_t> tokens;  // head: [n_tokens] ids
  std::vector<float> hidden;    // other stages: [n_tokens, n_embd] f32
};

class BatchScheduler {
 public:
  explicit BatchScheduler(int max_rows) : max_rows_(max_rows) {}

  // A decode step (a row past the prompt) or a prompt chunk.
  void AddDecode(Work w) { decode_.push_back(std::move(w)); }
  void AddPrefill(Work w) { prefill_.push_back(std::move(w)); }

  // Takes the next batch: decode steps first, then prompt chunks, each in arrival order, up to
  // `max_rows` rows (an item larger than that runs alone). A session has at most one item in a
  // batch, and once one of its items is held back none of its later ones is taken, so a session's
  // rows never overtake each other. Items of sessions for which `live` is false are dropped.
  std::vector<Work> NextBatch(const std::function<bool(uint32_t)>& live);

  // Removes every queued item of `session` and returns them in the order they would run (its
  // prompt chunks, then its decode steps, each in arrival order): the rows a
  // session was sent before it closes, which the stage still runs so that every stage runs the
  // same rows.
  std::vector<Work> TakeSession(uint32_t session);

  void Clear() {
    decode_.clear();
    prefill_.clear();
  }
  size_t size() const { return decode_.size() + prefill_.size(); }

 private:
  int max_rows_;
  std::deque<Work> decode_, prefill_;
};

// One forward pass over `items`, in order.
using ForwardFn = std::function<Status(std::span<const Work> items, ForwardOutput* out)>;

// Runs `batch` with `forward` and hands `done` each group of items that ran with its output.
// A refused forward pass changes no state, so when the whole batch is refused each item runs
// alone: only the item that is refused alone fails (`failed`), the others still run. Returns
// whether the batch ran as one pass.
bool RunBatchOrEach(std::span<const Work> batch, const ForwardFn& forward,
                    const std::function<void(std::span<const Work>, const ForwardOutput&)>& done,
                    const std::function<void(const Work&, const Status&)>& failed);

// The model input for `items`: one chunk per item, their token ids or hidden rows concatenated.
// `tokens` and `hidden` hold the data `in` points to.
void BuildForwardInput(std::span<const Work> items, ForwardInput* in, std::vector<int32_t>* tokens,
                       std::vector<float>* hidden);

}  // namespace kvasir::ring
