// A ring whose links cross delaying proxies (net::DelayProxy), as hops over a network would: the
// tokens do not change, and every token waits for every hop. Only lower bounds on time are
// asserted: a loaded machine makes anything slower, never faster.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "net/delay_proxy.h"
#include "ring/client.h"
#include "ring/sampling_wire.h"
#include "ring_test_util.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::GenerateOnRing;
using testing::Greedy;
using testing::LocalRing;

constexpr double kHopDelayMs = 20;
constexpr int kStages = 3;

// A ring of `n` stages of `model` where stage i dials a proxy that delays each direction by
// `delay_ms` and forwards to stage i + 1. The proxies outlive the ring (declared first).
struct DelayedRing {
  std::vector<std::unique_ptr<net::DelayProxy>> proxies;
  std::unique_ptr<LocalRing> ring;

  DelayedRing(const std::string& model, int n, double delay_ms) {
    ring = LocalRing::Start(model, n, wire::Dtype::kF32, 256, 64, 256,
                            [&](int, ring::StageOptions& o) {
                              net::DelayProxyOptions p;
                              p.target = o.next;
                              p.shape.delay_ms = delay_ms;
                              auto proxy = net::DelayProxy::Start(p);
                              ASSERT_TRUE(proxy.ok()) << proxy.status().message();
                              o.next = (*proxy)->address();
                              proxies.push_back(std::move(proxy).value());
                            });
  }
  ~DelayedRing() {
    ring.reset();  // the stages first, so none sees its link fail while stopping
    proxies.clear();
  }
};

TEST(HopDelayTest, GreedyTokensAreTheSameBehindDelayedHops) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string model = AssetPath("models/stories260K.gguf");
  std::vector<int32_t> direct_ids;
  {
    auto direct = LocalRing::Start(model, kStages);
    ASSERT_NE(direct, nullptr);
    direct_ids = GenerateOnRing(direct->head(), "Once upon a time", Greedy(), 24).ids;
  }
  ASSERT_EQ(direct_ids.size(), 24u);
  DelayedRing delayed(model, kStages, kHopDelayMs);
  ASSERT_NE(delayed.ring, nullptr);
  const std::vector<int32_t> ids =
      GenerateOnRing(delayed.ring->head(), "Once upon a time", Greedy(), 24).ids;
  EXPECT_EQ(ids, direct_ids);
  for (const auto& p : delayed.proxies) {
    EXPECT_GE(p->Stats().connections, 1u) << p->address() << " carried no link";
    EXPECT_GT(p->Stats().bytes_forwarded, 0u) << p->address();
  }
}

TEST(HopDelayTest, EveryTokenWaitsForTheSumOfTheHopDelays) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  DelayedRing delayed(AssetPath("models/stories260K.gguf"), kStages, kHopDelayMs);
  ASSERT_NE(delayed.ring, nullptr);
  auto client = ring::RingClient::Connect(delayed.ring->head(), 20000, testing::kTestRingSecret);
  ASSERT_TRUE(client.ok()) << client.status().message();
  ring::GenerateMsg req;
  req.prompt = "Once upon a time";
  constexpr int kTokens = 16;
  req.sampling = ring::SamplingToWire(Greedy(), kTokens, /*ignore_eos=*/true);
  auto r = (*client)->Generate(req, [](const ring::TokenMsg&) {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->n_generated, kTokens);
  // The prompt crosses every hop once before the first token; each later token crosses them all.
  const double ring_ms = kStages * kHopDelayMs;
  EXPECT_GE(r->ttft_ms, ring_ms);
  EXPECT_GE((r->total_ms - r->ttft_ms) / (kTokens - 1), ring_ms);
}

}  // namespace
}  // namespace kvasir
