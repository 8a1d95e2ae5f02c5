// Drawing a token under a grammar without computing the full mask for most tokens.
//
// Let p be the sampler's distribution over the vocabulary and A the allowed set, with p(A) > 0.
// The exact constrained distribution is q(t) = p(t) / p(A) for t in A. DrawConstrained draws t
// from p; when t is in A it is returned (checking one token is cheap); otherwise the full mask is
// computed and a second draw is made from p restricted to A and renormalised. For t in A:
//
//   P(t) = p(t)                      (the first draw is t)
//        + (1 - p(A)) * p(t) / p(A)   (the first draw was refused, the second is t)
//        = p(t) (p(A) + 1 - p(A)) / p(A) = p(t) / p(A) = q(t),
//
// so the result follows q exactly, and the mask is computed only with probability 1 - p(A): when
// the model already follows the grammar, rarely. (Truncations such as top-k or top-p must be part
// of p; if they leave A empty the caller must draw from the untruncated distribution instead.)
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "base/status.h"
#include "grammar/recognizer.h"
#include "grammar/token_mask.h"

namespace kvasir::grammar {

struct ConstrainedDraw {
  int32_t token = -1;
  bool used_mask = false;  // the first draw was refused and the full mask was computed
};

// Draws a token from `weights` (non-negative, unnormalised, [n_vocab]) restricted to the tokens
// the grammar allows after `m`, as explained above. `mask` is scratch (its contents are replaced
// when the full mask is needed). Errors: `weights` does not have one entry per token, a weight is
// negative or not finite, no allowed token has a positive weight, or the recognizer fails.
Result<ConstrainedDraw> DrawConstrained(std::span<const float> weights, const TokenTrie& trie,
                                        const Matcher& m, std::mt19937_64* rng, TokenMask* mask);

}  // namespace kvasir::grammar
