#include "model/sampler.h"

#include <gtest/gtest.h>

#include <map>

namespace kvasir {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f};

TEST(SamplerTest, GreedyPicksFirstMaximum) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.Sample(kLogits, {}), 1);
  EXPECT_EQ(ArgMax(kLogits), 1);
}

TEST(SamplerTest, SeedReproducesAndTopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 42;
  Sampler a(p), b(p);
  std::vector<int32_t> sa, sb;
  for (int i = 0; i < 50; ++i) {
    sa.push_back(a.Sample(kLogits, {}));
    sb.push_back(b.Sample(kLogits, {}));
  }
  EXPECT_EQ(sa, sb);
  p.top_k = 1;
  Sampler k1(p);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.Sample(kLogits, {}), 1);
}

TEST(SamplerTest, CutsKeepOnlyLikelyTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.5f;  // keeps tokens with p >= 0.5 * p_max: logits 3.0, 3.0, 2.5
  Sampler s(p);
  std::map<int32_t, int> counts;
  for (int i = 0; i < 400; ++i) counts[s.Sample(kLogits, {})]++;
  for (auto [id, n] : counts) EXPECT_TRUE(id == 1 || id == 2 || id == 4) << id;
  EXPECT_GT(counts[1], 50);
  EXPECT_GT(counts[4], 50);

  p.min_p = 0.0f;
  p.top_p = 0.5f;  // the two 3.0 logits carry about 0.6 of the mass
  Sampler tp(p);
  for (int i = 0; i < 200; ++i) {
    const int32_t id = tp.Sample(kLogits, {});
    EXPECT_TRUE(id == 1 || id == 4) << id;
  }
}

TEST(SamplerTest, RepetitionPenaltyDemotesRecentTokens) {
  SamplingParams p;
  p.temperature = 0;
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  const std::vector<int32_t> history = {1, 4};
  EXPECT_EQ(s.Sample(kLogits, history), 2);  // 3.0 / 2 = 1.5 < 2.5
}

}  // namespace
}  // namespace kvasir
