// A flush written a slice at a time (Store::FlushLeaseSlice, as `kvasir market` writes renewals
// between requests): until its slice is written, a renewal is answered from memory and a nonce is
// refused from memory; a renewal taken again during the round is written as it is then; what a
// slice wrote survives a restart.
#include <gtest/gtest.h>

#include "market_fixture.h"

namespace kvasir::market {
namespace {

class FlushSliceTest : public MarketFixture {
 protected:
  static MarketConfig Config() {
    MarketConfig c;
    c.lease_s = 30;
    c.lease_flush_s = 0.5;
    return c;
  }
  void SetUp() override {
    Open(kvasir::testing::TestModel("tiny", 2), Config());
    api_->StartBackgroundFlush();
  }
  bool Postgres() const { return db_.rfind("postgresql:", 0) == 0; }
  ApiRequest SignedBeat(int key, int64_t claim, double now) {
    return kvasir::testing::Signed(keys_[key], "POST", "/v1/heartbeat",
                                   nlohmann::json{{"claim", claim}, {"serving_epoch", -1}}.dump(),
                                   now);
  }
  // The claim's lease as another process on the database sees it.
  double WrittenExpiry(int64_t claim, double now) {
    auto other = Store::Open(db_);
    EXPECT_TRUE(other.ok()) << other.status().message();
    other.value()->set_lease_s(30);
    auto map = other.value()->Map(now);
    EXPECT_TRUE(map.ok()) << map.status().message();
    for (const RingState& r : (*map)[0].rings) {
      for (const WindowState& w : r.windows) {
        if (w.claim && w.claim->id == claim) return w.claim->expires;
      }
    }
    return 0;
  }
};

TEST_F(FlushSliceTest, WhatWaitsForItsSliceIsAnsweredAndRefusedFromMemoryAndWrittenAsItIsThen) {
  std::vector<int64_t> ids = FillRing(kT0, 0);
  for (int64_t id : FillRing(kT0, 1)) ids.push_back(id);
  ASSERT_EQ(ids.size(), 6u);
  ASSERT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  std::vector<ApiRequest> beats;
  for (int k = 0; k < 6; ++k) {
    beats.push_back(SignedBeat(k, ids[static_cast<size_t>(k)], kT0 + 10));
    ASSERT_EQ(api_->Handle(beats.back(), kT0 + 10).status, 200);
  }
  const size_t nonces = Postgres() ? 0 : 6;  // PostgreSQL writes each nonce at once
  EXPECT_EQ(store_->pending_leases(), 6u);
  EXPECT_EQ(store_->pending_nonces(), nonces);
  // Not due before the interval: nothing is written (and no heartbeat flushes on its own).
  auto left = api_->FlushLeaseSlice(kT0 + 10.3, 2, 0.5);
  ASSERT_TRUE(left.ok()) << left.status().message();
  EXPECT_EQ(*left, 0u);
  auto reply = store_->Heartbeat(kvasir::testing::Hex(keys_[2]), ids[2], -1, kT0 + 10.3, 30);
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(store_->pending_leases(), 6u);

  // Due: the first slice writes the two lowest claims, and only them.
  left = api_->FlushLeaseSlice(kT0 + 10.6, 2, 0.5);
  ASSERT_TRUE(left.ok()) << left.status().message();
  EXPECT_EQ(*left, 4 + nonces);
  EXPECT_EQ(store_->pending_leases(), 4u);
  EXPECT_DOUBLE_EQ(WrittenExpiry(ids[1], kT0 + 11), kT0 + 40);
  EXPECT_DOUBLE_EQ(WrittenExpiry(ids[2], kT0 + 11), kT0 + 30);
  // A heartbeat's ring (kept from the one before the slice) shows each neighbour's lease as
  // answered, written or not.
  reply = store_->Heartbeat(kvasir::testing::Hex(keys_[2]), ids[2], -1, kT0 + 10.7, 30);
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  ASSERT_EQ(reply->ring.windows.size(), 3u);
  EXPECT_DOUBLE_EQ(reply->ring.windows[0].claim->expires, kT0 + 40);    // written
  EXPECT_DOUBLE_EQ(reply->ring.windows[1].claim->expires, kT0 + 40);    // written
  EXPECT_DOUBLE_EQ(reply->ring.windows[2].claim->expires, kT0 + 40.3);  // in memory
  EXPECT_DOUBLE_EQ(reply->claim.expires, kT0 + 40.7);
  // While the round is open: a renewal is answered from memory, every nonce is refused.
  const ApiResponse again = Beat(keys_[5], ids[5], -1, kT0 + 11.2);
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_NEAR(kvasir::testing::Body(again)["expires_in"].get<double>(), 30, 0.01);
  for (int k : {0, 3}) {
    const ApiResponse replay = api_->Handle(beats[static_cast<size_t>(k)], kT0 + 11.3);
    EXPECT_EQ(replay.status, 401) << replay.body;
  }

  // The rest of the round: the claims renewed again meanwhile are written as they are now.
  for (int slices = 0; *left > 0; ++slices) {
    ASSERT_LT(slices, 20);
    left = api_->FlushLeaseSlice(kT0 + 11.5, 2, 0.5);
    ASSERT_TRUE(left.ok()) << left.status().message();
  }
  EXPECT_EQ(store_->pending_leases(), 0u);
  EXPECT_EQ(store_->pending_nonces(), Postgres() ? 0u : 1u);  // the beat at kT0 + 11.2
  EXPECT_DOUBLE_EQ(WrittenExpiry(ids[2], kT0 + 12), kT0 + 40.7);
  EXPECT_DOUBLE_EQ(WrittenExpiry(ids[3], kT0 + 12), kT0 + 40);
  EXPECT_DOUBLE_EQ(WrittenExpiry(ids[5], kT0 + 12), kT0 + 41.2);

  // Killed (what waits in memory is lost) and restarted: the nonces the round wrote are refused.
  Reopen(Config());
  for (int k : {0, 5}) {
    const ApiResponse replay = api_->Handle(beats[static_cast<size_t>(k)], kT0 + 12);
    EXPECT_EQ(replay.status, 401) << replay.body;
    EXPECT_NE(Reason(replay).find("replayed"), std::string::npos) << Reason(replay);
  }
}

// A full flush (as at a stop) in the middle of a round writes the rest of it too.
TEST_F(FlushSliceTest, AFullFlushFinishesARound) {
  std::vector<int64_t> ids = FillRing(kT0, 0);
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(Beat(keys_[k], ids[static_cast<size_t>(k)], -1, kT0 + 10).status, 200);
  }
  auto left = api_->FlushLeaseSlice(kT0 + 10.6, 1, 0.5);
  ASSERT_TRUE(left.ok()) << left.status().message();
  EXPECT_GT(*left, 0u);
  ASSERT_TRUE(api_->FlushLeases(kT0 + 11.1, /*force=*/true).ok());
  EXPECT_EQ(store_->pending_leases(), 0u);
  EXPECT_EQ(store_->pending_nonces(), 0u);
  for (int64_t id : ids) EXPECT_DOUBLE_EQ(WrittenExpiry(id, kT0 + 12), kT0 + 40);
  // Nothing of the round is left: the next slice has nothing due.
  left = api_->FlushLeaseSlice(kT0 + 11.2, 1, 0.5);
  ASSERT_TRUE(left.ok()) << left.status().message();
  EXPECT_EQ(*left, 0u);
}

}  // namespace
}  // namespace kvasir::market
