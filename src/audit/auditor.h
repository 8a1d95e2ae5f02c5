// The market's recompute auditor (docs/MARKET.md, "Recomputation"): takes from the market's store
// the audits of one model whose reveals matched their commitments, recomputes each revealed window
// on the CPU (recompute.h) and records the verdict there; a window whose outputs fall outside the
// tolerance fails its audit (the line's credit forfeited, the holder banned and evicted, as for a
// bad reveal). `kvasir audit` runs it in a loop beside the market processes, on their database.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "audit/recompute.h"
#include "base/status.h"
#include "gguf/gguf_file.h"
#include "market/store.h"

namespace kvasir::audit {

struct AuditorOptions {
  std::string model;  // the name the model is registered under in the market
  double tolerance = kDefaultTolerance;
  int n_threads = 1;
  int batch = 16;  // audits taken per round
};

struct AuditorStats {
  int64_t passed = 0;       // recomputed within the tolerance
  int64_t failed = 0;       // outside it, or rows the window cannot have produced
  int64_t skipped = 0;      // nothing the auditor could judge (see Recomputer::Check)
  double worst_passed = 0;  // the largest difference of a row that passed
};

class Auditor {
 public:
  // Refuses a model the store does not know, or a file whose identity is not the model's (a
  // recomputation on other weights would fail honest holders).
  static Result<std::unique_ptr<Auditor>> Create(market::Store* store,
                                                 std::shared_ptr<const GgufFile> file,
                                                 const AuditorOptions& options, double now);

  // One round: recomputes at most options.batch pending audits and records their verdicts.
  // Returns how many were handled (0: none was waiting).
  Result<int> RunOnce(double now);
  const AuditorStats& stats() const { return stats_; }

 private:
  Auditor(market::Store* store, std::shared_ptr<const GgufFile> file, AuditorOptions options)
      : store_(store), file_(std::move(file)), options_(std::move(options)) {}
  Result<Recomputer*> WindowOf(int first, int last);

  market::Store* store_;
  std::shared_ptr<const GgufFile> file_;
  AuditorOptions options_;
  std::map<std::pair<int, int>, std::unique_ptr<Recomputer>> windows_;
  AuditorStats stats_;
};

}  // namespace kvasir::audit
