// A client that ends its session early (a stop string found by the caller, a user who left): the
// session is freed on every stage, the link serves the next request as if nothing happened, and
// refusals come back with a code the caller can branch on. On a real three-stage ring of
// stories260K.
#include <gtest/gtest.h>

#include <atomic>

#include "ring/sampling_wire.h"
#include "ring_test_util.h"
#include "test_assets.h"

namespace kvasir::testing {
namespace {

constexpr const char* kModel = "models/stories260K.gguf";

ring::GenerateMsg Request(const std::string& prompt, uint32_t max_tokens) {
  ring::GenerateMsg g;
  g.prompt = prompt;
  g.sampling = ring::SamplingToWire(Greedy(), max_tokens, /*ignore_eog=*/true);
  return g;
}

uint32_t OpenSessions(ring::RingClient& client) {
  auto stats = client.Stats();
  EXPECT_TRUE(stats.ok()) << stats.status().message();
  uint32_t open = 0;
  if (stats.ok()) {
    EXPECT_EQ(stats->size(), 3u);
    for (const wire::StageStats& s : *stats) open += s.sessions_open;
  }
  return open;
}

TEST(RingClientSessionTest, EndingEarlyFreesTheSessionOnEveryStageAndKeepsTheLink) {
  KV_REQUIRE_ASSET(kModel);
  auto ring = LocalRing::Start(AssetPath(kModel), 3);
  auto client = ring::RingClient::Connect(ring->head(), 20000, kTestRingSecret);
  ASSERT_TRUE(client.ok()) << client.status().message();
  ASSERT_TRUE((*client)->WaitReady(20000).ok());

  int seen = 0;
  auto r = (*client)->Generate(
      Request("Once upon a time", 200), [&](const ring::TokenMsg&) { return ++seen < 3; }, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->reason, wire::FinishReason::kClientClosed);
  EXPECT_EQ(seen, 3);
  // STATS goes around behind the CLOSE: every stage has freed the session by then.
  EXPECT_EQ(OpenSessions(**client), 0u);

  // The same link runs the next request exactly as a fresh client does.
  const Generation expected = GenerateOnRing(ring->head(), "The dog", Greedy(), 12);
  std::string text;
  auto again = (*client)->Generate(
      Request("The dog", 12),
      [&](const ring::TokenMsg& t) {
        text += t.piece;
        return true;
      },
      nullptr);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(text, expected.text);
  EXPECT_TRUE((*client)->usable());
}

TEST(RingClientSessionTest, ACancelFromAnotherThreadEndsTheSession) {
  KV_REQUIRE_ASSET(kModel);
  auto ring = LocalRing::Start(AssetPath(kModel), 3);
  auto client = ring::RingClient::Connect(ring->head(), 20000, kTestRingSecret);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->WaitReady(20000).ok());
  std::atomic<bool> cancel{false};
  int seen = 0;
  auto r = (*client)->Generate(
      Request("Once upon a time", 200),
      [&](const ring::TokenMsg&) {
        if (++seen == 2) cancel = true;  // as the HTTP thread would, when its client leaves
        return true;
      },
      &cancel);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->reason, wire::FinishReason::kClientClosed);
  EXPECT_EQ(seen, 2);
  EXPECT_EQ(OpenSessions(**client), 0u);
}

TEST(RingClientSessionTest, RefusalsCarryACode) {
  KV_REQUIRE_ASSET(kModel);
  auto ring = LocalRing::Start(AssetPath(kModel), 3);  // a context of 256
  auto client = ring::RingClient::Connect(ring->head(), 20000, kTestRingSecret);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->WaitReady(20000).ok());
  std::string long_prompt;
  for (int i = 0; i < 300; ++i) long_prompt += " dog";
  auto r = (*client)->Generate(
      Request(long_prompt, 4), [](const ring::TokenMsg&) { return true; }, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kTooLarge) << r.status().message();
  EXPECT_NE(r.status().message().find("context"), std::string::npos) << r.status().message();

  ring::GenerateMsg bad = Request("Once", 4);
  bad.sampling.flags |= wire::kSamplingExtra;
  bad.extra.logit_bias = {{1 << 20, 1.0f}};
  auto refused = (*client)->Generate(
      bad, [](const ring::TokenMsg&) { return true; }, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(refused.status().message().find("logit_bias"), std::string::npos);
}

// A logit bias reaches the last stage of the ring and decides what it samples there.
TEST(RingClientSessionTest, ALogitBiasReachesTheLastStage) {
  KV_REQUIRE_ASSET(kModel);
  auto ring = LocalRing::Start(AssetPath(kModel), 3);
  auto client = ring::RingClient::Connect(ring->head(), 20000, kTestRingSecret);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->WaitReady(20000).ok());
  ring::GenerateMsg g = Request("Once upon a time", 6);
  g.sampling.flags |= wire::kSamplingExtra;
  g.extra.logit_bias = {{300, 100.0f}};
  std::vector<int32_t> ids;
  auto r = (*client)->Generate(
      g,
      [&](const ring::TokenMsg& t) {
        ids.push_back(t.token.id);
        return true;
      },
      nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(ids, std::vector<int32_t>(6, 300));
}

}  // namespace
}  // namespace kvasir::testing
