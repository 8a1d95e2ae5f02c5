#include "grammar/constrained_draw.h"

#include <cmath>

namespace kvasir::grammar {
namespace {

// Inverse-CDF draw over the entries `keep` accepts; -1 when their total weight is zero.
template <typename Keep>
int32_t Draw(std::span<const float> w, std::mt19937_64* rng, Keep keep) {
  double total = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (keep(i)) total += w[i];
  }
  if (!(total > 0)) return -1;
  const double u = std::uniform_real_distribution<double>(0.0, total)(*rng);
  double acc = 0;
  int32_t last = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!keep(i) || w[i] <= 0) continue;
    acc += w[i];
    last = static_cast<int32_t>(i);
    if (u < acc) return last;
  }
  return last;  // rounding at the top end
}

}  // namespace

Result<ConstrainedDraw> DrawConstrained(std::span<const float> weights, const TokenTrie& trie,
                                        const Matcher& m, std::mt19937_64* rng, TokenMask* mask) {
  if (weights.size() != static_cast<size_t>(trie.n_vocab())) {
    return Error("constrained draw: {} weights for a vocabulary of {}", weights.size(),
                 trie.n_vocab());
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!(weights[i] >= 0) || std::isinf(weights[i])) {
      return Error("constrained draw: weight {} of token {} is not a finite non-negative number",
                   weights[i], i);
    }
  }
  ConstrainedDraw d;
  d.token = Draw(weights, rng, [](size_t) { return true; });
  if (d.token >= 0 && trie.Allows(m, d.token)) return d;
  KV_RETURN_IF_ERROR(m.status());
  d.used_mask = true;
  KV_RETURN_IF_ERROR(trie.FillMask(m, mask));
  d.token = Draw(weights, rng, [&](size_t i) { return mask->Test(static_cast<int32_t>(i)); });
  if (d.token < 0) {
    return Error("constrained draw: none of the {} tokens the grammar allows has a positive weight",
                 mask->Count());
  }
  return d;
}

}  // namespace kvasir::grammar
