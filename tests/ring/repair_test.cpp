// What a stage keeps while its ring is broken (ring/repair.h), alone: held sessions end at their
// deadline and not before, a second break does not extend a hold, a process older than the one
// that took its place is refused; and a last stage's sampler resumed after the tokens drawn before
// draws exactly what the undisturbed sampler draws next.
#include "ring/repair.h"

#include <gtest/gtest.h>

#include <random>

#include "ring/sampling_wire.h"
#include "ring/tail_sampler.h"

namespace kvasir::ring {
namespace {

using std::chrono::milliseconds;
using Clock = HoldBook::Clock;

TEST(HoldBookTest, HeldSessionsEndAtTheirDeadlineAndNotBefore) {
  HoldBook book(milliseconds(1000));
  const Clock::time_point t0{};
  const uint32_t ids[] = {3, 7};
  book.Hold(ids, t0);
  EXPECT_TRUE(book.held(3));
  EXPECT_TRUE(book.Expired(t0 + milliseconds(999)).empty());
  book.Release(7);  // replayed
  EXPECT_EQ(book.Expired(t0 + milliseconds(1000)), std::vector<uint32_t>{3});
  EXPECT_TRUE(book.empty());
}

TEST(HoldBookTest, ASecondBreakDoesNotExtendAHold) {
  HoldBook book(milliseconds(1000));
  const Clock::time_point t0{};
  const uint32_t first[] = {1};
  const uint32_t both[] = {1, 2};
  book.Hold(first, t0);
  book.Hold(both, t0 + milliseconds(600));
  EXPECT_EQ(book.since(1), t0);
  EXPECT_EQ(book.Expired(t0 + milliseconds(1000)), std::vector<uint32_t>{1});
  EXPECT_EQ(book.ids(), std::vector<uint32_t>{2});
}

TEST(HoldBookTest, WithoutATimeoutNothingIsHeld) {
  HoldBook book(milliseconds(0));
  const uint32_t ids[] = {1};
  book.Hold(ids, Clock::time_point{});
  EXPECT_FALSE(book.enabled());
  EXPECT_TRUE(book.empty());
}

TEST(HoldBookTest, OldestIsTheSessionHeldLongest) {
  HoldBook book(std::chrono::seconds(30));
  EXPECT_FALSE(book.Oldest().has_value());
  const auto t0 = HoldBook::Clock::now();
  const uint32_t late[] = {9};
  const uint32_t early[] = {12};
  book.Hold(late, t0 + std::chrono::seconds(2));
  book.Hold(early, t0);
  EXPECT_EQ(book.Oldest(), std::optional<uint32_t>(12));
  book.Release(12);
  EXPECT_EQ(book.Oldest(), std::optional<uint32_t>(9));
}

TEST(GenerationGateTest, AnOlderProcessIsRefusedOnceANewerOneLinked) {
  GenerationGate gate;
  EXPECT_TRUE(gate.Admit(100, "predecessor").ok());
  EXPECT_TRUE(gate.Admit(100, "predecessor").ok());  // the same process, linking again
  EXPECT_TRUE(gate.Admit(250, "predecessor").ok());  // a standby took its place
  const Status old = gate.Admit(100, "predecessor");
  EXPECT_EQ(old.code(), StatusCode::kConflict);
  EXPECT_EQ(old.message(),
            "predecessor of generation 100 is older than 250, which took its place: a newer "
            "process holds this window now");
  EXPECT_EQ(gate.newest(), 250u);
  // Once the newer process is gone, the older one may take the place back.
  EXPECT_TRUE(gate.Admit(100, "predecessor", /*newest_linked=*/false).ok());
  EXPECT_EQ(gate.newest(), 100u);
}

TEST(GenerationGateTest, NewGenerationsOnlyGrow) {
  const uint64_t a = NewGeneration();
  EXPECT_GT(NewGeneration(a + 1000000000), a + 1000000000);
}

// Random logits over a small vocabulary: a sampled run (temperature, top-k, penalties) that
// depends on the RNG at every step.
std::vector<float> Logits(std::mt19937& rng, int n_vocab) {
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> l(static_cast<size_t>(n_vocab));
  for (float& x : l) x = d(rng);
  return l;
}

TEST(TailSamplerResumeTest, AResumedSamplerDrawsWhatTheUndisturbedOneDraws) {
  constexpr int kVocab = 32;
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 12;
  p.repeat_penalty = 1.3f;
  p.repeat_last_n = 8;
  p.seed = 77;
  const wire::SamplingWire w = SamplingToWire(p, 64, /*ignore_eog=*/true);
  const std::vector<int32_t> prompt = {1, 5, 9};
  std::mt19937 rng(5);
  std::vector<std::vector<float>> logits;
  for (int i = 0; i < 40; ++i) logits.push_back(Logits(rng, kVocab));
  auto never = [](int32_t) { return false; };

  auto whole = TailSampler::Create(w, prompt, 256, kVocab);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  std::vector<int32_t> drawn;
  for (int i = 0; i < 40; ++i) {
    auto t = (*whole)->Sample(1, logits[i], 3 + i, 256, never);
    ASSERT_TRUE(t.ok());
    drawn.push_back(t->token.id);
  }
  for (int cut : {0, 1, 17, 39}) {
    auto resumed = TailSampler::Create(w, prompt, 256, kVocab);
    ASSERT_TRUE(resumed.ok());
    ASSERT_TRUE((*resumed)->Resume(std::span<const int32_t>(drawn).first(cut), kVocab).ok());
    EXPECT_EQ((*resumed)->n_generated(), cut);
    for (int i = cut; i < 40; ++i) {
      auto t = (*resumed)->Sample(1, logits[i], 3 + i, 256, never);
      ASSERT_TRUE(t.ok());
      EXPECT_EQ(t->token.id, drawn[i]) << "resumed after " << cut << ", token " << i;
    }
  }
}

TEST(TailSamplerResumeTest, RefusesIdsOutsideTheVocabulary) {
  auto s = TailSampler::Create(SamplingToWire(SamplingParams{}, 8, false), {1}, 64, 16);
  ASSERT_TRUE(s.ok());
  const int32_t bad[] = {3, 16};
  EXPECT_EQ((*s)->Resume(bad, 16).message(), "replay: token 16 is outside the vocabulary of 16");
}

}  // namespace
}  // namespace kvasir::ring
