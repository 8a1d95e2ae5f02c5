// The prompt cache: ended sessions kept on every stage, taken over by a later session whose
// prompt starts with the same tokens. The cache alone (budget, age, best prefix, exact ends for
// recurrent state), then rings of stories260K and of the hybrid synth-qwen35moe: a cached answer
// equals an uncached one token for token, a stage that kept nothing makes the head open the
// session afresh, and nothing is left open.
#include "ring/prompt_cache.h"

#include <gtest/gtest.h>

#include "ring/sampling_wire.h"
#include "ring_test_util.h"
#include "test_assets.h"

namespace kvasir::testing {
namespace {

using ring::PromptCache;

PromptCache::Entry Kept(uint32_t session, std::vector<int32_t> tokens, uint64_t bytes,
                        PromptCache::Clock::time_point at = PromptCache::Clock::now()) {
  PromptCache::Entry e;
  e.session = session;
  e.length = static_cast<int>(tokens.size());
  e.bytes = bytes;
  e.tokens = std::move(tokens);
  e.last = at;
  return e;
}

TEST(PromptCacheTest, KeepsWithinItsBudgetOldestOut) {
  PromptCache c(100, std::chrono::seconds(60));
  EXPECT_TRUE(c.Put(Kept(1, {1, 2}, 40)).empty());
  EXPECT_TRUE(c.Put(Kept(2, {1, 3}, 40)).empty());
  EXPECT_EQ(c.Put(Kept(3, {1, 4}, 40)), (std::vector<uint32_t>{1}));
  EXPECT_EQ(c.bytes(), 80u);
  EXPECT_EQ(c.Put(Kept(4, {5}, 101)), (std::vector<uint32_t>{4})) << "over the budget alone";
  EXPECT_FALSE(c.Take(1).has_value());
  auto two = c.Take(2);
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->tokens, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.EvictOldest(), std::optional<uint32_t>(3));
  EXPECT_EQ(c.bytes(), 0u);
}

TEST(PromptCacheTest, PicksTheLongestCommonPrefix) {
  PromptCache c(1000, std::chrono::seconds(60));
  c.Put(Kept(1, {1, 2, 3, 4}, 1));
  c.Put(Kept(2, {1, 2, 9}, 1));
  const std::vector<int32_t> ids = {1, 2, 3, 7, 8};
  auto m = c.Best(ids, false);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->session, 1u);
  EXPECT_EQ(m->n_keep, 3);
  // The last prompt token always runs: a prompt equal to a kept one keeps one less.
  auto same = c.Best(std::vector<int32_t>{1, 2, 3, 4}, false);
  ASSERT_TRUE(same.has_value());
  EXPECT_EQ(same->n_keep, 3);
  // Recurrent state cannot be cut: only an entry the prompt extends whole.
  EXPECT_FALSE(c.Best(ids, true).has_value());
  auto exact = c.Best(std::vector<int32_t>{1, 2, 9, 5}, true);
  ASSERT_TRUE(exact.has_value());
  EXPECT_EQ(exact->session, 2u);
  EXPECT_EQ(exact->n_keep, 3);
  EXPECT_FALSE(c.Best(std::vector<int32_t>{5, 6}, false).has_value());
}

TEST(PromptCacheTest, LeavesAnEntryAPromptWouldKeepLessThanHalfOf) {
  PromptCache c(1000, std::chrono::seconds(60));
  // A chat of 8 prompt tokens and 4 answer tokens.
  PromptCache::Entry chat = Kept(1, {1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 23}, 1);
  chat.n_prompt = 8;
  c.Put(chat);
  // A short prompt sharing the chat's first three tokens would consume the whole entry for 3.
  EXPECT_FALSE(c.Best(std::vector<int32_t>{1, 2, 3, 9, 9}, false).has_value());
  auto half = c.Best(std::vector<int32_t>{1, 2, 3, 4, 9}, false);
  ASSERT_TRUE(half.has_value());
  EXPECT_EQ(half->n_keep, 4);
  auto next_turn = c.Best(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 23, 30}, false);
  ASSERT_TRUE(next_turn.has_value());
  EXPECT_EQ(next_turn->n_keep, 12);
  // Without a prompt count the entry's whole length is the measure.
  c.Put(Kept(2, {40, 41, 42, 43, 44, 45}, 1));
  EXPECT_FALSE(c.Best(std::vector<int32_t>{40, 41, 50}, false).has_value());
  EXPECT_TRUE(c.Best(std::vector<int32_t>{40, 41, 42, 50}, false).has_value());
}

TEST(PromptCacheTest, ExpiresByAge) {
  PromptCache c(1000, std::chrono::milliseconds(100));
  const auto t0 = PromptCache::Clock::now();
  c.Put(Kept(1, {1}, 1, t0));
  c.Put(Kept(2, {2}, 1, t0 + std::chrono::milliseconds(80)));
  EXPECT_EQ(c.Expire(t0 + std::chrono::milliseconds(150)), (std::vector<uint32_t>{1}));
  EXPECT_EQ(c.size(), 1u);
}

using Answer = CachedAnswer;

Answer Ask(const std::string& head, const std::string& prompt, int n, uint64_t seed = 0,
           float temperature = 0) {
  return AskReportingCache(head, prompt, n, seed, temperature);
}

uint32_t OpenSessions(const std::string& head, int n_stages) {
  auto client = ring::RingClient::Connect(head, 20000, kTestRingSecret);
  EXPECT_TRUE(client.ok());
  auto stats = (*client)->Stats();
  EXPECT_TRUE(stats.ok()) << stats.status().message();
  uint32_t open = 0;
  if (stats.ok()) {
    EXPECT_EQ(stats->size(), static_cast<size_t>(n_stages));
    for (const wire::StageStats& s : *stats) open += s.sessions_open;
  }
  return open;
}

std::unique_ptr<LocalRing> Ring(const std::string& model, int n, uint64_t cache_bytes,
                                int uncached_stage = -1) {
  return LocalRing::Start(
      model, n, wire::Dtype::kF32, 256, 16, 256,
      [=](int i, ring::StageOptions& o) { o.cache_bytes = i == uncached_stage ? 0 : cache_bytes; });
}

// A second turn that starts with the first's prompt and answer takes their positions over, and
// answers exactly as a ring without the cache does (greedy and seeded).
TEST(PromptCacheRingTest, ASecondTurnTakesTheFirstOverAndAnswersTheSame) {
  const char* kModel = "models/stories260K.gguf";
  KV_REQUIRE_ASSET(kModel);
  const std::string model = AssetPath(kModel);
  const std::string first = "Once upon a time, there was a little dog named Max.";
  auto cached = Ring(model, 3, 64 << 20);
  const Answer a = Ask(cached->head(), first, 24);
  EXPECT_EQ(a.n_cached, 0);
  const std::string second = first + a.text + " Then Max saw a big red ball.";
  const Answer b = Ask(cached->head(), second, 24);
  EXPECT_GT(b.n_cached, 20) << "the first turn's positions were not taken over";
  const Answer c = Ask(cached->head(), second + b.text + " The end?", 16, 99, 0.9f);
  EXPECT_GT(c.n_cached, b.n_cached);
  EXPECT_EQ(OpenSessions(cached->head(), 3), 0u);
  cached.reset();

  auto plain = Ring(model, 3, 0);
  const Answer b0 = Ask(plain->head(), second, 24);
  EXPECT_EQ(b0.n_cached, 0);
  EXPECT_EQ(b.ids, b0.ids);
  EXPECT_EQ(b.text, b0.text);
  const Answer c0 = Ask(plain->head(), second + b.text + " The end?", 16, 99, 0.9f);
  EXPECT_EQ(c.ids, c0.ids);
}

// A stage that kept nothing (no cache there): the head opens the session afresh, unseen by the
// client but for the count, and the answer is the same.
TEST(PromptCacheRingTest, AStageThatKeptNothingMakesTheHeadStartAfresh) {
  const char* kModel = "models/stories260K.gguf";
  KV_REQUIRE_ASSET(kModel);
  const std::string model = AssetPath(kModel);
  const std::string first = "Lily and Tom went to the park to play.";
  auto ring = Ring(model, 3, 64 << 20, /*uncached_stage=*/1);
  const Answer a = Ask(ring->head(), first, 16);
  const std::string second = first + a.text + " They saw a cat.";
  const Answer b = Ask(ring->head(), second, 16);
  EXPECT_EQ(b.n_cached, 0);
  EXPECT_EQ(OpenSessions(ring->head(), 3), 0u) << "a session was left open on some stage";
  ring.reset();
  auto plain = Ring(model, 3, 0);
  EXPECT_EQ(Ask(plain->head(), second, 16).ids, b.ids);
}

// Recurrent (DeltaNet) state is taken over only at its exact end: a prompt that extends a kept
// one whole, on the hybrid model.
TEST(PromptCacheRingTest, RecurrentStateIsTakenOverAtItsExactEnd) {
  const char* kModel = "models/synth-qwen35moe-f32.gguf";
  KV_REQUIRE_ASSET(kModel);
  const std::string model = AssetPath(kModel);
  const std::string first = "The quick brown fox";
  auto cached = Ring(model, 2, 64 << 20);
  const Answer a = Ask(cached->head(), first, 1);  // kept: the prompt's positions exactly
  const Answer b = Ask(cached->head(), first + " jumps over the lazy dog", 12);
  EXPECT_GT(b.n_cached, 0) << "the prompt extends the kept one whole";
  // A prompt that shares only part of a kept session cannot cut its recurrent state.
  const Answer c = Ask(cached->head(), "The quick red", 4);
  EXPECT_EQ(c.n_cached, 0);
  EXPECT_EQ(OpenSessions(cached->head(), 2), 0u);
  cached.reset();
  auto plain = Ring(model, 2, 0);
  EXPECT_EQ(Ask(plain->head(), first + " jumps over the lazy dog", 12).ids, b.ids);
  EXPECT_EQ(Ask(plain->head(), "The quick red", 4).ids, c.ids);
}

}  // namespace
}  // namespace kvasir::testing
