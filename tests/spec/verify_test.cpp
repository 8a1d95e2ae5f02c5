// Sampler::Verify, the acceptance rule of speculative decoding: greedy takes a draft only when it
// is the argmax; with temperature the token it returns is distributed as Sampler::Sample's,
// whichever draft it was given (checked with a chi-square test over many draws).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "model/sampler.h"

namespace kvasir {
namespace {

TEST(VerifyTest, GreedyAcceptsOnlyTheArgmax) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  const std::vector<float> logits = {0.1f, 2.0f, 1.5f, -1.0f};
  auto yes = s.Verify(logits, {}, 1);
  EXPECT_TRUE(yes.accepted);
  EXPECT_EQ(yes.token, 1);
  auto no = s.Verify(logits, {}, 2);
  EXPECT_FALSE(no.accepted);
  EXPECT_EQ(no.token, 1);
}

// The chi-square statistic of `counts` (n draws) against probabilities `p`.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double x2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * n;
    x2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return x2;
}

TEST(VerifyTest, TemperatureKeepsTheSamplersDistribution) {
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_k = 0;
  params.top_p = 1.0f;
  params.min_p = 0.0f;
  params.seed = 42;
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, 1.7f, -0.3f};
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(logits[i] / params.temperature);
  for (double& v : p) v /= sum;
  constexpr int kDraws = 20000;
  // Five categories, four degrees of freedom: 25 is beyond the 0.01 % tail (18.5 is 0.1 %).
  for (int32_t draft : {1, 2, 4}) {
    Sampler s(params);
    std::vector<int> counts(p.size());
    int accepted = 0;
    for (int i = 0; i < kDraws; ++i) {
      const Sampler::Verdict v = s.Verify(logits, {}, draft);
      ASSERT_EQ(v.accepted, v.token == draft);
      counts[v.token]++;
      accepted += v.accepted;
    }
    EXPECT_LT(ChiSquare(counts, p, kDraws), 25.0) << "draft " << draft;
    // The draft is taken with probability p(draft).
    EXPECT_NEAR(static_cast<double>(accepted) / kDraws, p[draft], 0.02) << "draft " << draft;
  }
}

// The token a verification decides is the one Sample draws from the same state, whatever the
// draft, and each takes one draw: a seed gives the same tokens with drafts as without, and a
// sampler advanced by SkipDraw once per token (a repair's replay) goes on with the same tokens.
TEST(VerifyTest, AVerifiedTokenIsTheTokenSampleDrawsWithOneDraw) {
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_k = 0;
  params.top_p = 1.0f;
  params.min_p = 0.0f;
  params.seed = 1234;
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, 1.7f, -0.3f};
  Sampler sampled(params), verified(params), resumed(params);
  int accepted = 0;
  for (int i = 0; i < 400; ++i) {
    const int32_t want = sampled.Sample(logits, {});
    const int32_t draft = (i * 7) % 5;
    const Sampler::Verdict v = verified.Verify(logits, {}, draft);
    ASSERT_EQ(v.token, want) << "step " << i;
    ASSERT_EQ(v.accepted, want == draft) << "step " << i;
    accepted += v.accepted;
    if (i < 300) resumed.SkipDraw();
    if (i >= 300) EXPECT_EQ(resumed.Sample(logits, {}), want) << "step " << i;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, 400);
}

TEST(VerifyTest, ADraftOutsideTheSurvivorsIsAlwaysRejected) {
  SamplingParams params;
  params.temperature = 1.0f;
  params.top_k = 2;
  params.seed = 7;
  Sampler s(params);
  const std::vector<float> logits = {3.0f, 2.9f, -5.0f, 0.0f};
  for (int i = 0; i < 200; ++i) {
    const Sampler::Verdict v = s.Verify(logits, {}, 3);
    EXPECT_FALSE(v.accepted);
    EXPECT_TRUE(v.token == 0 || v.token == 1) << v.token;
  }
}

}  // namespace
}  // namespace kvasir
