// Replayed heartbeats (docs/MARKET.md, "Replayed heartbeats"): with SQLite and renewals in
// memory, a heartbeat writes no nonce row; its claim's stamp (the latest signed second and the
// nonces of that second) refuses a replay while it waits in memory, once the flush wrote it, and
// after a restart. PostgreSQL writes each heartbeat's nonce at once (another process on the
// database must refuse it too).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "market/lease_table.h"
#include "market_fixture.h"

namespace kvasir::market {
namespace {

const std::string kA(32, 'a'), kB(32, 'b'), kC(32, 'c');

TEST(BeatStampTest, RefusesAnEarlierSecondAndANonceOfTheSameSecondTwice) {
  BeatStamp s;
  EXPECT_FALSE(s.Refuses(100, kA));
  s.Add(100, kA);
  EXPECT_TRUE(s.Refuses(100, kA));
  EXPECT_FALSE(s.Refuses(100, kB));  // two heartbeats in one second
  s.Add(100, kB);
  EXPECT_TRUE(s.Refuses(99, kC));
  EXPECT_FALSE(s.Refuses(101, kA));  // a later second: any nonce
  s.Add(101, kC);
  EXPECT_EQ(s.count(), 1u);
  EXPECT_TRUE(s.Refuses(100, kB));
  // Merged: the later second wins; the same second keeps both sets.
  BeatStamp t;
  t.Add(101, kA);
  t.Merge(s);
  EXPECT_EQ(t.time, 101);
  EXPECT_TRUE(t.Contains(kA) && t.Contains(kC));
  t.Merge(BeatStamp{100, kB});
  EXPECT_EQ(t.count(), 2u);
  // Bounded: a flood of one second is refused past kMaxNonces.
  BeatStamp f;
  for (size_t i = 0; i < BeatStamp::kMaxNonces; ++i) {
    const std::string n = fmt::format("{:032x}", i);
    ASSERT_FALSE(f.Refuses(5, n));
    f.Add(5, n);
  }
  EXPECT_TRUE(f.Refuses(5, std::string(32, 'f')));
  EXPECT_FALSE(f.Refuses(6, std::string(32, 'f')));
}

class HeartbeatNonceTest : public MarketFixture {
 protected:
  void SetUp() override { Open(kvasir::testing::TestModel(), Config()); }
  static MarketConfig Config() {
    MarketConfig c;
    c.lease_s = 30;
    c.lease_flush_s = 100;  // nothing is flushed on its own during a test
    return c;
  }
  bool Postgres() const { return db_.rfind("postgresql:", 0) == 0; }
  ApiRequest BeatRequest(int key, int64_t claim, double now) const {
    return kvasir::testing::Signed(keys_[key], "POST", "/v1/heartbeat",
                                   nlohmann::json{{"claim", claim}, {"serving_epoch", -1}}.dump(),
                                   now);
  }
  // The claim's last heartbeat as the map (the store's answer) has it.
  double LastBeat(double now) {
    auto map = store_->Map(now);
    EXPECT_TRUE(map.ok()) << map.status().message();
    const auto& claim = (*map)[0].rings[0].windows[0].claim;
    return claim ? claim->last_beat : -1;
  }
};

TEST_F(HeartbeatNonceTest, AReplayIsRefusedInMemoryOnceWrittenAndAfterARestart) {
  const int64_t claim = ClaimWindow(0, 0, kT0);
  ASSERT_GE(claim, 0);
  const ApiRequest beat = BeatRequest(0, claim, kT0 + 5);
  ASSERT_EQ(api_->Handle(beat, kT0 + 5).status, 200);
  // Another heartbeat of the same second is no replay.
  const ApiRequest second = BeatRequest(0, claim, kT0 + 5);
  ASSERT_EQ(api_->Handle(second, kT0 + 5.5).status, 200);
  // Not yet written: refused from memory.
  EXPECT_EQ(store_->pending_leases(), 1u);
  EXPECT_EQ(api_->Handle(beat, kT0 + 6).status, 401);
  // Written with the renewals: refused from the claim's row.
  ASSERT_TRUE(api_->FlushLeases(kT0 + 7, /*force=*/true).ok());
  EXPECT_EQ(store_->pending_leases(), 0u);
  EXPECT_EQ(api_->Handle(beat, kT0 + 8).status, 401);
  EXPECT_EQ(api_->Handle(second, kT0 + 8).status, 401);
  // A restart after the flush (as `kvasir market` stops) still refuses both.
  Reopen(Config());
  for (const ApiRequest* replay : {&beat, &second}) {
    const ApiResponse again = api_->Handle(*replay, kT0 + 9);
    EXPECT_EQ(again.status, 401) << again.body;
    EXPECT_NE(Reason(again).find("replayed"), std::string::npos) << Reason(again);
  }
  // And the claim's last renewal is the second heartbeat's.
  EXPECT_DOUBLE_EQ(LastBeat(kT0 + 9), kT0 + 5.5);
  // A heartbeat of a later second is answered; with stamps, one signed before it is then
  // refused, although its nonce was never seen.
  if (Postgres()) return;
  ASSERT_EQ(Beat(keys_[0], claim, -1, kT0 + 12).status, 200);
  const ApiResponse late = api_->Handle(BeatRequest(0, claim, kT0 + 11), kT0 + 12);
  EXPECT_EQ(late.status, 401) << late.body;
  EXPECT_NE(Reason(late).find("before the last heartbeat"), std::string::npos) << Reason(late);
}

// A heartbeat that changes more than its lease is written at once, and its stamp waits in memory
// with the renewals: its replay is refused before and after the flush.
TEST_F(HeartbeatNonceTest, AReplayOfAHeartbeatWrittenAtOnceIsRefused) {
  const int64_t claim = ClaimWindow(0, 0, kT0);
  ASSERT_GE(claim, 0);
  const ApiRequest serving = kvasir::testing::Signed(
      keys_[0], "POST", "/v1/heartbeat",
      nlohmann::json{{"claim", claim}, {"serving_epoch", 0}}.dump(), kT0 + 5);
  ASSERT_EQ(api_->Handle(serving, kT0 + 5).status, 200);
  EXPECT_EQ(api_->Handle(serving, kT0 + 6).status, 401);
  ASSERT_TRUE(api_->FlushLeases(kT0 + 7, /*force=*/true).ok());
  Reopen(Config());
  EXPECT_EQ(api_->Handle(serving, kT0 + 8).status, 401);
}

// A heartbeat that fails records nothing: its replay fails for the same reason, not as a replay.
TEST_F(HeartbeatNonceTest, AFailedHeartbeatKeepsNoNonce) {
  const int64_t claim = ClaimWindow(0, 0, kT0);
  ASSERT_GE(claim, 0);
  const ApiRequest stolen = BeatRequest(1, claim, kT0 + 5);
  EXPECT_EQ(api_->Handle(stolen, kT0 + 5).status, 403);
  EXPECT_EQ(store_->pending_leases(), 0u);
  EXPECT_EQ(api_->Handle(stolen, kT0 + 6).status, 403);
}

}  // namespace
}  // namespace kvasir::market
