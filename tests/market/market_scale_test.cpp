// The parts of the store that keep a claim and a heartbeat as cheap on a model of many windows as
// on a small one (docs/MARKET.md, "The store"): each reads only its ring, and learns how many
// windows of its model are uncovered from a count kept with the claims, which must agree with the
// map however claims come and go.
#include <gtest/gtest.h>

#include "market_fixture.h"

namespace kvasir::market {
namespace {

class MarketScaleTest : public MarketFixture {
 protected:
  void SetUp() override { Open(kvasir::testing::TestModel("tiny", 3)); }  // 9 windows
  // Every uncovered window of the map has the rate of `uncovered` of 9 windows, as has each
  // uncovered window a heartbeat of `claim` (held by key `k`) returns for its ring.
  void ExpectUncovered(int uncovered, int k, int64_t claim, double now) {
    const double want = RewardRate(0, uncovered, 9);
    auto map = store_->Map(now);
    ASSERT_TRUE(map.ok()) << map.status().message();
    int seen = 0;
    for (const RingState& r : (*map)[0].rings) {
      for (const WindowState& w : r.windows) {
        if (w.claim) continue;
        ++seen;
        EXPECT_DOUBLE_EQ(w.rate, want) << "ring " << r.ring << " window " << w.window;
      }
    }
    EXPECT_EQ(seen, uncovered);
    auto beat = store_->Heartbeat(kvasir::testing::Hex(keys_[k]), claim, -1, now, 30);
    ASSERT_TRUE(beat.ok()) << beat.status().message();
    for (const WindowState& w : beat->ring.windows) {
      if (!w.claim) {
        EXPECT_DOUBLE_EQ(w.rate, want) << "window " << w.window;
      }
    }
  }
};

TEST_F(MarketScaleTest, TheUncoveredCountFollowsClaimsReleasesExpiriesAndAReopen) {
  double now = kT0;
  auto first = store_->Claim(Request(0, 0, 0), now, 30);
  ASSERT_TRUE(first.ok()) << first.status().message();
  // The rate a claim locks counts every window of the model, not only its ring's.
  EXPECT_DOUBLE_EQ(first->claim.rate, RewardRate(0, 9, 9));
  ExpectUncovered(8, 0, first->claim.id, now);
  auto second = store_->Claim(Request(1, 2, 1), now, 30);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_DOUBLE_EQ(second->claim.rate, RewardRate(0, 8, 9));
  auto third = store_->Claim(Request(2, 1, 2), now, 10);  // a shorter lease: it expires first
  ASSERT_TRUE(third.ok()) << third.status().message();
  ExpectUncovered(6, 0, first->claim.id, now);
  // A refused claim (the window is held) changes nothing.
  EXPECT_EQ(store_->Claim(Request(3, 2, 1), now, 30).status().code(), StatusCode::kConflict);
  ExpectUncovered(6, 1, second->claim.id, now);
  ASSERT_TRUE(store_->Release(kvasir::testing::Hex(keys_[1]), second->claim.id, now).ok());
  ExpectUncovered(7, 0, first->claim.id, now);
  // The third claim's lease passes (the first is renewed by the heartbeats meanwhile).
  now += 8;
  ExpectUncovered(7, 0, first->claim.id, now);
  now += 8;
  ExpectUncovered(8, 0, first->claim.id, now);
  Reopen();
  ExpectUncovered(8, 0, first->claim.id, now);
  // Replacing the model drops its claims: all 9 are uncovered again.
  ASSERT_TRUE(store_->AddModel(kvasir::testing::TestModel("tiny", 3), true, now).ok());
  auto again = store_->Claim(Request(4, 1, 1), now, 30);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_DOUBLE_EQ(again->claim.rate, RewardRate(0, 9, 9));
  ExpectUncovered(8, 4, again->claim.id, now);
}

// A heartbeat records its nonce in its own transaction: a replay is refused as before, and renews
// nothing.
TEST_F(MarketScaleTest, AReplayedHeartbeatIsRefusedAndRenewsNothing) {
  const int64_t claim = ClaimWindow(0, 0, kT0);
  ASSERT_GE(claim, 0);
  const ApiRequest beat = kvasir::testing::Signed(
      keys_[0], "POST", "/v1/heartbeat",
      nlohmann::json{{"claim", claim}, {"serving_epoch", -1}}.dump(), kT0 + 5);
  ASSERT_EQ(api_->Handle(beat, kT0 + 5).status, 200);
  const ApiResponse again = api_->Handle(beat, kT0 + 6);
  EXPECT_EQ(again.status, 401) << again.body;
  EXPECT_NE(Reason(again).find("replayed"), std::string::npos) << Reason(again);
  auto map = store_->Map(kT0 + 6);
  ASSERT_TRUE(map.ok());
  EXPECT_DOUBLE_EQ((*map)[0].rings[0].windows[0].claim->last_beat, kT0 + 5);
  // A malformed body is refused for its replay too, once its nonce was seen.
  const ApiRequest bad =
      kvasir::testing::Signed(keys_[0], "POST", "/v1/heartbeat", "{\"claim\": 0}", kT0 + 7);
  EXPECT_EQ(api_->Handle(bad, kT0 + 7).status, 400);
  EXPECT_EQ(api_->Handle(bad, kT0 + 8).status, 401);
}

// A heartbeat answers from the ring it read last while the database is unchanged (ring_cache.cpp):
// every change of the ring, by this store or another connection to the database, shows in the
// very next heartbeat, as does a renewal held in memory.
TEST_F(MarketScaleTest, AHeartbeatSeesEveryChangeOfItsRingAtOnce) {
  const std::string a = kvasir::testing::Hex(keys_[0]);
  auto first = store_->Claim(Request(0, 0, 0), kT0, 30);
  ASSERT_TRUE(first.ok()) << first.status().message();
  const int64_t claim = first->claim.id;
  auto beat = [&](double now) {
    auto r = store_->Heartbeat(a, claim, -1, now, 30);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? r->ring : RingState{};
  };
  EXPECT_FALSE(beat(kT0 + 0.1).windows[1].claim.has_value());
  // A claim through this store.
  auto second = store_->Claim(Request(1, 0, 1), kT0 + 0.2, 30);
  ASSERT_TRUE(second.ok()) << second.status().message();
  RingState r = beat(kT0 + 0.3);
  ASSERT_TRUE(r.windows[1].claim.has_value());
  EXPECT_EQ(r.windows[1].claim->id, second->claim.id);
  // A claim through another connection to the database (another market process).
  auto other = Store::Open(db_);
  ASSERT_TRUE(other.ok()) << other.status().message();
  (*other)->set_lease_s(30);
  auto third = (*other)->Claim(Request(2, 0, 2), kT0 + 0.4, 30);
  ASSERT_TRUE(third.ok()) << third.status().message();
  r = beat(kT0 + 0.5);
  ASSERT_TRUE(r.windows[2].claim.has_value());
  EXPECT_EQ(r.windows[2].claim->id, third->claim.id);
  EXPECT_TRUE(r.complete);
  // Released through the other connection: gone at the next heartbeat, and the epoch moved.
  const int64_t epoch = r.epoch;
  ASSERT_TRUE((*other)->Release(kvasir::testing::Hex(keys_[2]), third->claim.id, kT0 + 0.6).ok());
  r = beat(kT0 + 0.7);
  EXPECT_FALSE(r.windows[2].claim.has_value());
  EXPECT_NE(r.epoch, epoch);
  // The renewal of the heartbeat before, held in memory, shows in the ring of the next one.
  r = beat(kT0 + 0.8);
  ASSERT_TRUE(r.windows[0].claim.has_value());
  EXPECT_DOUBLE_EQ(r.windows[0].claim->last_beat, kT0 + 0.7);
  EXPECT_DOUBLE_EQ(r.windows[0].claim->expires, kT0 + 30.7);
}

}  // namespace
}  // namespace kvasir::market
