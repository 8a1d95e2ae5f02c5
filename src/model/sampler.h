// Token sampling over one row of logits: greedy, temperature, top-k, top-p, min-p, repetition
// penalty, with a seeded RNG so that a seed reproduces a run.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kvasir {

struct SamplingParams {
  float temperature = 0.0f;     // <= 0: greedy (argmax, first index wins ties)
  int top_k = 40;               // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off; applied to the last `repeat_last_n` tokens
  int repeat_last_n = 64;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks a token from `logits` (n_vocab values). `history` holds previous tokens (prompt and
  // generated) for the repetition penalty.
  int32_t Sample(std::span<const float> logits, std::span<const int32_t> history);

  // Speculative verification of `draft`, a token proposed by a deterministic drafter for the
  // position these logits predict. Greedy: accepted when it is the argmax; otherwise the argmax
  // is returned. With temperature: accepted with probability p(draft) under the distribution
  // Sample draws from; otherwise a token drawn from p with the draft removed (renormalised), which
  // is speculative rejection sampling for a drafter certain of its token. The token is the one
  // Sample(logits, history) returns, from the same one draw of the RNG: a seed gives the same
  // tokens with or without drafts, and a sampler resumed with SkipDraw per token (a replay)
  // continues them exactly.
  struct Verdict {
    bool accepted = false;
    int32_t token = 0;  // the draft when accepted
  };
  Verdict Verify(std::span<const float> logits, std::span<const int32_t> history, int32_t draft);

  // Sample in two steps, for a caller that restricts the choice further (a grammar):
  // Weigh leaves in `out` the tokens Sample would draw from, with their unnormalised weights at
  // the temperature, highest first (greedy: the argmax alone, weight 1); Draw picks one of
  // `weights` as Sample does, advancing the RNG (greedy: the first, without it).
  // Sample(l, h) == Draw(Weigh(l, h)) exactly.
  struct Weighted {
    double weight;
    int32_t id;
  };
  void Weigh(std::span<const float> logits, std::span<const int32_t> history,
             std::vector<Weighted>* out);
  int32_t Draw(std::span<const Weighted> weights);

  // Advances the RNG as one Sample of a token does (one draw; greedy: none), for a sampler that
  // resumes a sequence whose tokens were drawn elsewhere with the same seed.
  void SkipDraw();

  const SamplingParams& params() const { return params_; }
  bool greedy() const { return params_.temperature <= 0.0f; }

 private:
  // Greedy: the argmax into *best and 0 returned. Otherwise candidates_ cut to the survivors of
  // top-k/top-p/min-p, highest first, their weights at the temperature in *weights (unnormalised);
  // returns the survivors' count.
  size_t Survivors(std::span<const float> logits, std::span<const int32_t> history,
                   std::vector<double>* weights, int32_t* best);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<double> weights_;  // [survivors] of the last call
};

// Index of the largest value; the first one wins ties.
int32_t ArgMax(std::span<const float> values);

}  // namespace kvasir
