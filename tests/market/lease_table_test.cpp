// Renewals in memory (docs/MARKET.md, "Renewals in memory"): a heartbeat that changes nothing but
// its lease is written with the others at the next flush, while its own market answers and
// decides with it; one that changes more is written at once.
#include "market/lease_table.h"

#include <gtest/gtest.h>

#include "market_fixture.h"

namespace kvasir::market {
namespace {

TEST(LeaseTableTest, KeepsTheLatestRenewalOfAClaimAndForgetsOnlyWhatWasWritten) {
  LeaseTable t;
  t.Renew(7, "a", 130, 100);
  t.Renew(7, "a", 120, 90);  // a clock that stepped back shortens nothing
  ASSERT_NE(t.Find(7), nullptr);
  EXPECT_DOUBLE_EQ(t.Find(7)->expires, 130);
  EXPECT_DOUBLE_EQ(t.Find(7)->last_beat, 100);
  const auto written = t.pending();
  t.Renew(8, "b", 140, 110);
  t.Renew(7, "a", 135, 105);  // renewed again while the flush ran: stays
  t.Written(written);
  ASSERT_NE(t.Find(7), nullptr);
  EXPECT_DOUBLE_EQ(t.Find(7)->expires, 135);
  EXPECT_NE(t.Find(8), nullptr);
  const auto all = t.pending();
  t.Written(all);
  EXPECT_TRUE(t.empty());
  // Another node's renewal of the same id replaces the entry rather than extending it.
  t.Renew(9, "a", 200, 170);
  t.Renew(9, "c", 150, 120);
  EXPECT_EQ(t.Find(9)->node, "c");
  EXPECT_DOUBLE_EQ(t.Find(9)->expires, 150);
}

// A flush on another thread takes everything; if it fails, what it took comes back merged with
// what was renewed meanwhile: no lease is shortened, no stamp's nonce lost.
TEST(LeaseTableTest, WhatAFailedFlushTookComesBackMergedWithLaterRenewals) {
  LeaseTable t;
  t.Renew(7, "a", 130, 100, BeatStamp{100, std::string(32, 'a')});
  t.Renew(8, "b", 140, 110);
  t.Renew(9, "d", 500, 400);
  const PendingLeases taken = t.Take();
  EXPECT_TRUE(t.empty());
  t.Renew(7, "a", 135, 105, BeatStamp{100, std::string(32, 'b')});  // renewed meanwhile
  t.Renew(9, "c", 120, 90);  // the claim's holder changed meanwhile
  t.Restore(taken);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_DOUBLE_EQ(t.Find(7)->expires, 135);
  EXPECT_EQ(t.Find(7)->stamp.count(), 2u);
  EXPECT_DOUBLE_EQ(t.Find(8)->expires, 140);
  EXPECT_EQ(t.Find(9)->node, "c");
  EXPECT_DOUBLE_EQ(t.Find(9)->expires, 120);
}

class LeaseFlushTest : public MarketFixture {
 protected:
  void SetUp() override {
    MarketConfig c;
    c.lease_s = 30;
    c.lease_flush_s = 100;  // nothing is flushed on its own during a test
    Open(kvasir::testing::TestModel(), c);
  }
};

TEST_F(LeaseFlushTest, ARenewalWaitsInMemoryButItsMarketAnswersAndDecidesWithIt) {
  const int64_t claim = ClaimWindow(0, 0, kT0);
  ASSERT_GE(claim, 0);
  const ApiResponse beat = Beat(keys_[0], claim, -1, kT0 + 20);
  ASSERT_EQ(beat.status, 200) << beat.body;
  EXPECT_NEAR(kvasir::testing::Body(beat)["expires_in"].get<double>(), 30, 0.01);
  EXPECT_EQ(store_->pending_leases(), 1u);
  // Written: the claim's lease of kT0 + 30; answered: kT0 + 50.
  EXPECT_DOUBLE_EQ(Row(claim, kT0 + 21).expires, kT0 + 30);
  EXPECT_EQ(RingJson(kT0 + 21)["windows"][0]["claim"], claim);
  // Past the written lease: this market's sweep writes the renewal instead of lapsing the claim.
  EXPECT_EQ(RingJson(kT0 + 35)["windows"][0]["claim"], claim);
  EXPECT_DOUBLE_EQ(Row(claim, kT0 + 36).expires, kT0 + 50);
  // A flush writes what waits; then nothing waits.
  ASSERT_EQ(Beat(keys_[0], claim, -1, kT0 + 40).status, 200);
  ASSERT_TRUE(api_->FlushLeases(kT0 + 41, /*force=*/true).ok());
  EXPECT_EQ(store_->pending_leases(), 0u);
  EXPECT_DOUBLE_EQ(Row(claim, kT0 + 41).expires, kT0 + 70);
  EXPECT_DOUBLE_EQ(Row(claim, kT0 + 41).last_beat, kT0 + 40);
}

TEST_F(LeaseFlushTest, AHeartbeatThatChangesItsServingEpochIsWrittenAtOnce) {
  const int64_t claim = ClaimWindow(0, 0, kT0);
  ASSERT_GE(claim, 0);
  ASSERT_EQ(Beat(keys_[0], claim, 3, kT0 + 10).status, 200);
  // No renewal waits; on SQLite the heartbeat's replay stamp does (heartbeat_replay_test.cpp).
  for (const auto& [id, p] : store_->waiting_leases()) EXPECT_EQ(p.expires, 0) << id;
  const ClaimInfo row = Row(claim, kT0 + 11);
  EXPECT_EQ(row.serving_epoch, 3);
  EXPECT_DOUBLE_EQ(row.expires, kT0 + 40);
}

// Killed with a renewal in memory, restarted after the written lease ran out: the flush interval
// (at most a third of the lease) keeps the written lease past the start of the silence the
// restart forgives, so the claim stays.
TEST_F(LeaseFlushTest, AMarketThatDiesWithRenewalsInMemoryLapsesNoClaimAfterItsRestart) {
  MarketConfig c;
  c.lease_s = 30;
  c.lease_flush_s = 5;
  MakeApi(c);
  const int64_t claim = ClaimWindow(0, 0, kT0);
  ASSERT_GE(claim, 0);
  ASSERT_EQ(Beat(keys_[0], claim, -1, kT0 + 10).status, 200);
  ASSERT_EQ(Beat(keys_[0], claim, -1, kT0 + 16).status, 200);  // flushed: kT0 + 46
  EXPECT_EQ(store_->pending_leases(), 0u);
  ASSERT_EQ(Beat(keys_[0], claim, -1, kT0 + 20).status, 200);  // in memory: kT0 + 50
  ASSERT_EQ(store_->pending_leases(), 1u);
  EXPECT_DOUBLE_EQ(Row(claim, kT0 + 21).expires, kT0 + 46);
  // Killed: the last renewal is lost. Back 14 s after the written lease ran out.
  Reopen(c);
  ASSERT_TRUE(store_->Resume(kT0 + 60).ok());
  EXPECT_EQ(RingJson(kT0 + 60)["windows"][0]["claim"], claim);
  ASSERT_EQ(Beat(keys_[0], claim, -1, kT0 + 61).status, 200);
  EXPECT_EQ(RingJson(kT0 + 62)["windows"][0]["claim"], claim);
}

}  // namespace
}  // namespace kvasir::market
