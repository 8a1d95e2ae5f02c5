// Prompt lookup: a drafter without a model. It finds the latest earlier place where the history's
// last n tokens occurred (n from max_n down to min_n) and proposes what followed there. Repetitive
// text (code, quoted passages, lists, a prompt the answer echoes) drafts well; free prose rarely.
#pragma once

#include "spec/drafter.h"

namespace kvasir::spec {

class NgramDrafter final : public Drafter {
 public:
  // 1 <= min_n <= max_n.
  NgramDrafter(int min_n = 2, int max_n = 4);
  const char* name() const override { return "ngram"; }
  Result<std::vector<int32_t>> Propose(std::span<const int32_t> history, int max_tokens) override;

 private:
  int min_n_, max_n_;
};

}  // namespace kvasir::spec
