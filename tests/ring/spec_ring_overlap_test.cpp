// Speculation with overlap around the ring (--draft-windows): the last stage keeps several verify
// windows of a session in flight, each past the first guessed on the windows before it being
// accepted whole. Greedy output still equals the output without speculation token for token, on
// rings of 1 to 4 stages with 8 sessions at once, whether the guesses hold (a model drafting for
// itself) or mostly fail (prompt lookup made to guess at any acceptance, a draft model that
// disagrees); rollback across two windows leaves nothing behind, hybrid states included.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ring_test_util.h"
#include "spec_ring_util.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::LocalRing;

// A ring whose last stage drafts with `kind` and keeps `windows` verify windows in flight,
// guessing from an acceptance of `min_acceptance` on (0: always).
std::unique_ptr<LocalRing> StartOverlapRing(const std::string& model, int n_stages,
                                            spec::DraftKind kind, const std::string& draft,
                                            int windows, double min_acceptance,
                                            int max_tokens = 4) {
  spec::DraftOptions o = testing::DraftWith(kind, draft, max_tokens);
  o.windows = windows;
  o.overlap_min_acceptance = min_acceptance;
  return testing::StartDraftingRing(model, n_stages, o);
}

using OverlapCase = testing::SpecCase;

class OverlapRingTest : public ::testing::TestWithParam<OverlapCase> {};

// Eight sessions at once with three windows each in flight: greedy tokens and their logits are
// exactly one process's without speculation. A model drafting for itself guesses right every
// time; prompt lookup, made to guess whatever its acceptance, mostly guesses wrong.
TEST_P(OverlapRingTest, GreedyOutputEqualsNonSpeculative) {
  const OverlapCase c = GetParam();
  KV_REQUIRE_ASSET("models/" + c.model);
  const std::string model = AssetPath("models/" + c.model);
  const bool self = c.kind == spec::DraftKind::kModel;
  auto ring = StartOverlapRing(model, c.n_stages, c.kind, self ? model : "", 3, self ? 0.8 : 0.0);
  ASSERT_NE(ring, nullptr);
  const int n_predict = 40;
  testing::ExpectGreedySessionsEqual(ring->head(), testing::GreedyLocally(model, n_predict),
                                     n_predict,
                                     c.model + ", " + std::to_string(c.n_stages) + " stages");
  const ring::DraftTotals t = ring->stage(c.n_stages - 1).draft_totals();
  EXPECT_GT(t.guessed, 0u) << "windows were guessed ahead";
  if (self) {
    EXPECT_EQ(t.accepted, t.drafted);
    EXPECT_EQ(t.confirmed, t.guessed) << "a greedy model drafting for itself guesses right";
  } else {
    EXPECT_GT(t.guessed - t.confirmed, 0u) << "some guesses failed";
  }
}

std::vector<OverlapCase> Cases() {
  std::vector<OverlapCase> cases;
  for (int n : {1, 3, 4}) {
    cases.push_back({"stories260K.gguf", n, spec::DraftKind::kModel});
    cases.push_back({"stories260K.gguf", n, spec::DraftKind::kNgram});
    cases.push_back({"synth-qwen35moe-f32.gguf", n, spec::DraftKind::kModel});
  }
  cases.push_back({"synth-llama-q4_k_m.gguf", 2, spec::DraftKind::kModel});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Models, OverlapRingTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return testing::SpecCaseName(info.param); });

// A draft model that often disagrees, with windows guessed at any acceptance: most guesses fail,
// and every stage drops the rows of two windows at a time. Every token equals a fresh run's, and
// so does a second session that the prompt cache continues from the first one's kept state.
TEST(OverlapRingRollback, AfterManyFailedGuessesAContinuationEqualsAFreshRun) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  KV_REQUIRE_ASSET("models/stories260K-q4_0.gguf");
  const std::string model = AssetPath("models/stories260K.gguf");
  auto ring = StartOverlapRing(model, 3, spec::DraftKind::kModel,
                               AssetPath("models/stories260K-q4_0.gguf"), 2, 0.0, 6);
  ASSERT_NE(ring, nullptr);
  testing::ExpectContinuationsEqualFreshRuns(ring->head(), model);
  const ring::DraftTotals t = ring->stage(2).draft_totals();
  EXPECT_GT(t.drafted - t.accepted, 10u) << "too few rejections to test";
  EXPECT_GT(t.guessed - t.confirmed, 10u) << "too few failed guesses to test";
}

// The hybrid model's recurrent states come back from checkpoints two windows deep. With
// temperature, a model drafting for itself is rejected often, so guesses made at any acceptance
// often fail; 8 sessions at once still see, at every token, the logits of one pass of the whole
// model over the same sequence.
TEST(OverlapRingRollback, HybridStatesAfterFailedGuessesEqualOnePass) {
  KV_REQUIRE_ASSET("models/synth-qwen35moe-f32.gguf");
  const std::string model = AssetPath("models/synth-qwen35moe-f32.gguf");
  for (int n_stages : {1, 3, 4}) {
    auto ring = StartOverlapRing(model, n_stages, spec::DraftKind::kModel, model, 2, 0.0);
    ASSERT_NE(ring, nullptr);
    testing::ExpectSampledSessionsEqualOnePass(ring->head(), model,
                                               std::to_string(n_stages) + " stages");
    const ring::DraftTotals t = ring->stage(n_stages - 1).draft_totals();
    // (Guesses that hold on the hybrid model: the greedy cases of OverlapRingTest.)
    EXPECT_GT(t.guessed - t.confirmed, 10u) << n_stages << " stages: too few failed guesses";
  }
}

// With temperature and a seed, a session with overlap repeats: which windows are guessed, and
// which guesses hold, follow from the session's own tokens, never from timing.
TEST(OverlapRingSampling, SeededTemperatureRunRepeats) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string model = AssetPath("models/stories260K.gguf");
  auto ring = StartOverlapRing(model, 3, spec::DraftKind::kModel, model, 3, 0.0);
  ASSERT_NE(ring, nullptr);
  testing::ExpectSeededRunRepeats(ring->head());
  EXPECT_GT(ring->stage(2).draft_totals().guessed, 0u);
}

}  // namespace
}  // namespace kvasir
