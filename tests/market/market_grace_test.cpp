// Grace (docs/MARKET.md, "Grace"): a market that nodes could not reach (it was down, restarting or
// flooded: it answered no heartbeat for half a lease) expires none of the claims of the nodes that
// kept trying, and gives each a full lease once it answers again; only so long, and not for claims
// made during the silence.
#include <gtest/gtest.h>

#include "market_fixture.h"
#include "market_test_util.h"

namespace kvasir::market {
namespace {

using kvasir::testing::Body;
using nlohmann::json;

class GraceTest : public MarketFixture {
 protected:
  std::vector<std::string> Holders(double now) {
    std::vector<std::string> out;
    const json ring = RingJson(now);
    EXPECT_EQ(ring["windows"].size(), 3u) << Map(now);
    for (const auto& w : ring["windows"]) {
      out.push_back(w.contains("holder") ? w["holder"].get<std::string>() : "");
    }
    return out;
  }
  bool Held(double now, int window) {
    const auto holders = Holders(now);
    return static_cast<size_t>(window) < holders.size() &&
           !holders[static_cast<size_t>(window)].empty();
  }
};

TEST_F(GraceTest, ASilentMarketExpiresNoClaimOfTheNodesThatKeptTrying) {
  const auto ids = FillRing(kT0);
  for (int w = 0; w < 3; ++w) ASSERT_EQ(Beat(keys_[w], ids[w], -1, kT0 + 1).status, 200);
  // The market answers nothing for 100 s (the 30 s leases ran out long ago), then the page asks
  // for the map: every claim is still there.
  EXPECT_EQ(Holders(kT0 + 101), (std::vector<std::string>{kvasir::testing::Hex(keys_[0]),
                                                          kvasir::testing::Hex(keys_[1]),
                                                          kvasir::testing::Hex(keys_[2])}));
  // The first heartbeat that gets through gives every claim a full lease from then.
  ASSERT_EQ(Beat(keys_[0], ids[0], -1, kT0 + 102).status, 200);
  ASSERT_EQ(Beat(keys_[1], ids[1], -1, kT0 + 110).status, 200);
  EXPECT_TRUE(Held(kT0 + 131, 2));  // node 2 has until 102 + 30
  // Node 2 really is gone: its window frees up once the grace is over.
  ASSERT_EQ(Beat(keys_[0], ids[0], -1, kT0 + 125).status, 200);
  ASSERT_EQ(Beat(keys_[1], ids[1], -1, kT0 + 130).status, 200);
  EXPECT_FALSE(Held(kT0 + 133, 2));
  EXPECT_TRUE(Held(kT0 + 133, 0));
  EXPECT_EQ(Beat(keys_[2], ids[2], -1, kT0 + 134).status, 404);
}

TEST_F(GraceTest, WhileOthersAreAnsweredALeaseRunsOutAsAlways) {
  const auto ids = FillRing(kT0);
  for (double t = kT0 + 5; t < kT0 + 60; t += 5) {
    ASSERT_EQ(Beat(keys_[0], ids[0], -1, t).status, 200);
    ASSERT_EQ(Beat(keys_[2], ids[2], -1, t).status, 200);
  }
  EXPECT_FALSE(Held(kT0 + 60, 1));
  EXPECT_EQ(Beat(keys_[1], ids[1], -1, kT0 + 61).status, 404);
}

TEST_F(GraceTest, ASilenceIsForgivenForTenMinutesAtMost) {
  const auto ids = FillRing(kT0);
  for (int w = 0; w < 3; ++w) ASSERT_EQ(Beat(keys_[w], ids[w], -1, kT0 + 1).status, 200);
  // The silence began 15 s (half a lease) after the last heartbeat, at kT0 + 16; the lease clock
  // stands there for 600 s, then runs again: the leases (to kT0 + 31) end at kT0 + 631.
  EXPECT_TRUE(Held(kT0 + 630, 1));
  EXPECT_FALSE(Held(kT0 + 632, 1));
  EXPECT_EQ(Beat(keys_[0], ids[0], -1, kT0 + 633).status, 404);
}

TEST_F(GraceTest, ARestartedMarketForgivesTheTimeItWasDown) {
  const auto ids = FillRing(kT0);
  for (int w = 0; w < 3; ++w) ASSERT_EQ(Beat(keys_[w], ids[w], -1, kT0 + 1).status, 200);
  // Down for an hour, then started again on the same database.
  Reopen();
  ASSERT_TRUE(store_->Resume(kT0 + 3600).ok());
  EXPECT_TRUE(Held(kT0 + 3601, 0));
  EXPECT_TRUE(Held(kT0 + 3601, 2));
  ASSERT_EQ(Beat(keys_[2], ids[2], -1, kT0 + 3605).status, 200);
  ASSERT_EQ(Beat(keys_[0], ids[0], -1, kT0 + 3610).status, 200);
  ASSERT_EQ(Beat(keys_[1], ids[1], -1, kT0 + 3620).status, 200);
  json ring = RingJson(kT0 + 3620);
  EXPECT_TRUE(ring["complete"].get<bool>()) << ring;
  // Without the restart, an hour of silence would have been forgiven for ten minutes only.
}

TEST_F(GraceTest, AClaimMadeDuringASilenceHasNoGrace) {
  const int64_t a = Body(Claim(keys_[0], 0, kT0))["claim"].get<int64_t>();
  const int64_t b = Body(Claim(keys_[1], 1, kT0))["claim"].get<int64_t>();
  ASSERT_EQ(Beat(keys_[0], a, -1, kT0 + 1).status, 200);
  ASSERT_EQ(Beat(keys_[1], b, -1, kT0 + 1).status, 200);
  // In the silence a newcomer claims window 2 and never heartbeats: its lease runs as always.
  ASSERT_EQ(Claim(keys_[2], 2, kT0 + 100).status, 201);
  EXPECT_TRUE(Held(kT0 + 129, 2));
  EXPECT_FALSE(Held(kT0 + 131, 2));
  EXPECT_TRUE(Held(kT0 + 131, 0));  // the claims from before the silence are kept
}

}  // namespace
}  // namespace kvasir::market
