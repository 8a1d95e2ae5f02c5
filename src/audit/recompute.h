// The recompute half of an audit (docs/MARKET.md, "Audits"): a holder revealed, for positions of a
// session, the rows its window took in and gave out, and the reveal matched the commitment its
// receipt line signed. Recomputer runs the same window on the CPU over the revealed inputs of the
// session's first positions (a window's output at position p depends on its inputs at every
// position up to p: attention's keys and values, recurrent states) and compares its outputs with
// the revealed ones, row by row, within a tolerance that covers honest differences between
// kernels, SIMD widths and batchings. Not thread-safe: one Recomputer per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "model/layer_window.h"
#include "ring/row_store.h"

namespace kvasir::audit {

// The default tolerance: the largest relative L2 difference of an output row (||got - ours|| /
// ||ours||) that passes. Honest differences measured in docs/MARKET.md, "Recomputation".
inline constexpr double kDefaultTolerance = 0.04;

struct RecomputeReport {
  // Positions whose output row was recomputed and compared: the reveal's prefix from position 0
  // (0 for the last window, whose outputs are sampled tokens, see below).
  uint64_t compared = 0;
  double worst = 0;          // the largest relative L2 difference of a compared row
  uint64_t worst_index = 0;  // its position
  // Empty: every compared row is within the tolerance. Otherwise what is wrong, naming the
  // position: a row outside the tolerance, or rows of the wrong kind or size for this window
  // (the holder committed to rows its window cannot have produced).
  std::string failure;
};

class Recomputer {
 public:
  // Loads layers [first, last) of `file` (a full model or a slice holding them) on the CPU, with
  // the embeddings when first is 0 and the output head when last is n_layer.
  static Result<std::unique_ptr<Recomputer>> Load(std::shared_ptr<const GgufFile> file, int first,
                                                  int last, int n_threads);

  int first() const { return window_->spec().first; }
  int last() const { return window_->spec().last; }

  // Recomputes the positions 0, 1, ... k-1 the reveal holds (its longest prefix from position 0,
  // each leaf index equal to its position) and compares every output. The last window's output
  // is a sampled token, which depends on the client's seed and sampling settings the market never
  // sees: nothing of it is compared (compared = 0). Errors (the auditor cannot judge, the holder
  // is not at fault): no position 0 revealed, or a prefix position other than its leaf index (a
  // session that began from a cached prompt: the state it began with is not revealed).
  Result<RecomputeReport> Check(const ring::RowReveal& reveal, double tolerance);

 private:
  explicit Recomputer(std::unique_ptr<LayerWindow> window) : window_(std::move(window)) {}
  std::unique_ptr<LayerWindow> window_;
};

}  // namespace kvasir::audit
