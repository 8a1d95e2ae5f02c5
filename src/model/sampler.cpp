#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "base/check.h"

namespace kvasir {

int32_t ArgMax(std::span<const float> values) {
  int32_t best = 0;
  for (size_t i = 1; i < values.size(); ++i) {
    if (values[i] > values[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

size_t Sampler::Survivors(std::span<const float> logits, std::span<const int32_t> history,
                          std::vector<double>* weights, int32_t* best_out) {
  const int32_t n_vocab = static_cast<int32_t>(logits.size());
  candidates_.resize(logits.size());
  for (int32_t i = 0; i < n_vocab; ++i) candidates_[i] = {logits[i], i};

  // Repetition penalty over the recent window: shrink positive logits, push negative ones down.
  if (params_.repeat_penalty != 1.0f && params_.repeat_last_n != 0) {
    const size_t n = params_.repeat_last_n < 0
                         ? history.size()
                         : std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
    std::unordered_set<int32_t> seen(history.end() - n, history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= n_vocab) continue;
      float& l = candidates_[id].first;
      l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    }
  }

  if (params_.temperature <= 0.0f) {
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i) {
      if (candidates_[i].first > candidates_[best].first) best = i;
    }
    *best_out = best;
    return 0;
  }

  // Highest logits first; ties broken by id so the order (and the sample) is deterministic.
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = params_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);

  // Probabilities at temperature 1 decide the top-p and min-p cuts.
  std::vector<double> p(keep);
  const double max_logit = candidates_[0].first;
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp(candidates_[i].first - max_logit);
  for (double& v : p) v /= sum;
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    size_t n = 0;
    while (n < keep) {
      cum += p[n++];
      if (cum >= params_.top_p) break;
    }
    keep = std::max<size_t>(n, 1);
  }
  if (params_.min_p > 0.0f) {
    const double floor = p[0] * params_.min_p;
    size_t n = 1;
    while (n < keep && p[n] >= floor) ++n;
    keep = n;
  }
  candidates_.resize(keep);

  // The survivors' weights at the requested temperature.
  std::vector<double>& w = *weights;
  w.resize(keep);
  for (size_t i = 0; i < keep; ++i) {
    w[i] = std::exp((candidates_[i].first - max_logit) / params_.temperature);
  }
  return keep;
}

int32_t Sampler::Sample(std::span<const float> logits, std::span<const int32_t> history) {
  int32_t best = 0;
  const size_t keep = Survivors(logits, history, &weights_, &best);
  if (keep == 0) return best;
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += weights_[i];
  std::uniform_real_distribution<double> uni(0.0, total);
  double r = uni(rng_);
  for (size_t i = 0; i < keep; ++i) {
    r -= weights_[i];
    if (r < 0) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

void Sampler::SkipDraw() {
  if (greedy()) return;
  // The distribution's range does not change how much of the engine a draw takes.
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  (void)uni(rng_);
}

void Sampler::Weigh(std::span<const float> logits, std::span<const int32_t> history,
                    std::vector<Weighted>* out) {
  out->clear();
  int32_t best = 0;
  const size_t keep = Survivors(logits, history, &weights_, &best);
  if (keep == 0) {
    out->push_back({1.0, best});
    return;
  }
  out->reserve(keep);
  for (size_t i = 0; i < keep; ++i) out->push_back({weights_[i], candidates_[i].second});
}

int32_t Sampler::Draw(std::span<const Weighted> weights) {
  KV_CHECK(!weights.empty(), "Sampler::Draw: nothing to draw from");
  if (greedy()) return weights[0].id;
  double total = 0.0;
  for (const Weighted& w : weights) total += w.weight;
  std::uniform_real_distribution<double> uni(0.0, total);
  double r = uni(rng_);
  for (const Weighted& w : weights) {
    r -= w.weight;
    if (r < 0) return w.id;
  }
  return weights.back().id;
}

Sampler::Verdict Sampler::Verify(std::span<const float> logits, std::span<const int32_t> history,
                                 int32_t draft) {
  // The drafter proposes one token with certainty (q(draft) = 1), so speculative rejection
  // sampling accepts with probability p(draft) and otherwise draws from p without the draft:
  // exactly "draw from p, accept when the draw is the draft". Drawn as Sample draws, the token
  // does not depend on the draft, and the RNG takes one draw per token decided.
  const int32_t token = Sample(logits, history);
  return {token == draft, token};
}

}  // namespace kvasir
