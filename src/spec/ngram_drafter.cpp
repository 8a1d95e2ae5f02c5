#include "spec/ngram_drafter.h"

#include <algorithm>

#include "base/check.h"

namespace kvasir::spec {

NgramDrafter::NgramDrafter(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {
  KV_CHECK(min_n >= 1 && min_n <= max_n, "n-gram sizes {}..{}", min_n, max_n);
}

Result<std::vector<int32_t>> NgramDrafter::Propose(std::span<const int32_t> history,
                                                   int max_tokens) {
  const int64_t len = static_cast<int64_t>(history.size());
  if (max_tokens <= 0) return std::vector<int32_t>{};
  // Longer matches first: they predict better than short ones.
  for (int n = std::min<int64_t>(max_n_, len - 1); n >= min_n_; --n) {
    const auto tail = history.subspan(len - n);
    // The latest earlier occurrence, which ends before the tail itself.
    for (int64_t i = len - n - 1; i >= 0; --i) {
      if (!std::equal(tail.begin(), tail.end(), history.begin() + i)) continue;
      const int64_t from = i + n;
      const int64_t to = std::min<int64_t>(from + max_tokens, len);
      return std::vector<int32_t>(history.begin() + from, history.begin() + to);
    }
  }
  return std::vector<int32_t>{};
}

}  // namespace kvasir::spec
