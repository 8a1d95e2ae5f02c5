// The heartbeat of two round trips on PostgreSQL (postgres_heartbeat.cpp): it answers what the map
// (the general path) shows right after it, sees at once what another process changed, and leaves
// to the general path what it does not handle. On SQLite (which has only the general path, and
// its ring cache) the same answers are asked of every heartbeat; on PostgreSQL
// (market_api_test_postgresql) each of them must also have gone the two round trips.
#include <gtest/gtest.h>

#include "market_fixture.h"

namespace kvasir::market {
namespace {

class PipelinedHeartbeatTest : public MarketFixture {
 protected:
  void SetUp() override {
    Open(kvasir::testing::TestModel("tiny", 2));  // 2 rings of 3 windows
    if (::testing::Test::IsSkipped()) return;
    pg_ = db_.rfind("postgresql:", 0) == 0;
    store_->set_lease_s(30);
    // Every renewal written at once (not held in memory, where the map would show it and the
    // heartbeat's own ring would not yet), so the map shows what each heartbeat wrote.
    store_->set_lease_flush_s(0);
    auto other = Store::Open(db_);
    ASSERT_TRUE(other.ok()) << other.status().message();
    other_ = std::move(other).value();
    other_->set_lease_s(30);
  }
  // A heartbeat of key `k`'s claim through `store`, answered in two round trips; its ring must be
  // what the map shows right after it.
  RingState Beat(Store* store, int k, int64_t claim, int64_t epoch, double now) {
    const uint64_t before = store->pipelined_heartbeats();
    auto r = store->Heartbeat(kvasir::testing::Hex(keys_[k]), claim, epoch, now, 30);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return {};
    EXPECT_EQ(store->pipelined_heartbeats(), before + (pg_ ? 1 : 0))
        << "went the general way at " << now;
    EXPECT_EQ(r->claim.id, claim);
    EXPECT_DOUBLE_EQ(r->claim.expires, now + 30);
    EXPECT_EQ(r->claim.serving_epoch, epoch);
    auto map = store->Map(now);
    EXPECT_TRUE(map.ok()) << map.status().message();
    if (map.ok()) ExpectSame(r->ring, (*map)[0].rings[static_cast<size_t>(r->ring.ring)]);
    return r->ring;
  }
  static void ExpectSame(const RingState& got, const RingState& want) {
    EXPECT_EQ(got.ring, want.ring);
    EXPECT_EQ(got.epoch, want.epoch);
    EXPECT_EQ(got.complete, want.complete);
    EXPECT_EQ(got.serving, want.serving);
    EXPECT_EQ(got.ready, want.ready);
    EXPECT_DOUBLE_EQ(got.ready_since, want.ready_since);
    ASSERT_EQ(got.windows.size(), want.windows.size());
    for (size_t w = 0; w < got.windows.size(); ++w) {
      const WindowState& a = got.windows[w];
      const WindowState& b = want.windows[w];
      EXPECT_EQ(a.window, b.window);
      EXPECT_EQ(a.first, b.first);
      EXPECT_EQ(a.last, b.last);
      EXPECT_EQ(a.bytes, b.bytes);
      EXPECT_EQ(a.memory, b.memory);
      EXPECT_DOUBLE_EQ(a.rate, b.rate) << "window " << w;
      ASSERT_EQ(a.claim.has_value(), b.claim.has_value()) << "window " << w;
      if (a.claim) {
        EXPECT_EQ(a.claim->id, b.claim->id);
        EXPECT_EQ(a.claim->node, b.claim->node);
        EXPECT_DOUBLE_EQ(a.claim->expires, b.claim->expires) << "window " << w;
        EXPECT_DOUBLE_EQ(a.claim->last_beat, b.claim->last_beat) << "window " << w;
        EXPECT_EQ(a.claim->serving_epoch, b.claim->serving_epoch);
        EXPECT_DOUBLE_EQ(a.claim->serving_since, b.claim->serving_since);
        EXPECT_EQ(a.claim->verified_epoch, b.claim->verified_epoch);
      }
      EXPECT_EQ(a.standbys.size(), b.standbys.size());
    }
  }
  std::unique_ptr<Store> other_;  // another market process on the database
  bool pg_ = false;               // PostgreSQL (SQLite has only the general path)
};

TEST_F(PipelinedHeartbeatTest, AnswersWhatTheMapShowsAndSeesTheOtherProcessAtOnce) {
  double now = kT0;
  auto a = store_->Claim(Request(0, 0, 0), now, 30);
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = other_->Claim(Request(1, 0, 1), now, 30);
  ASSERT_TRUE(b.ok()) << b.status().message();
  (void)other_->Heartbeat(kvasir::testing::Hex(keys_[1]), b->claim.id, -1, now, 30);
  RingState r = Beat(store_.get(), 0, a->claim.id, -1, now += 0.1);
  EXPECT_TRUE(r.windows[1].claim.has_value());
  EXPECT_FALSE(r.complete);
  // Completed by the other process: seen by the next heartbeat, with the new epoch.
  auto c = other_->Claim(Request(2, 0, 2), now += 0.1, 30);
  ASSERT_TRUE(c.ok()) << c.status().message();
  r = Beat(store_.get(), 0, a->claim.id, -1, now += 0.1);
  EXPECT_TRUE(r.complete);
  const int64_t epoch = r.epoch;
  // Each holder serves the epoch (each heartbeat writes its claim): the ring serves once all do.
  r = Beat(store_.get(), 0, a->claim.id, epoch, now += 0.1);
  const double served_from = now;
  EXPECT_FALSE(r.serving);
  EXPECT_EQ(r.windows[0].claim->serving_epoch, epoch);
  EXPECT_DOUBLE_EQ(r.windows[0].claim->serving_since, served_from);
  r = Beat(other_.get(), 1, b->claim.id, epoch, now += 0.1);
  r = Beat(other_.get(), 2, c->claim.id, epoch, now += 0.1);
  EXPECT_TRUE(r.serving);
  EXPECT_FALSE(r.ready);  // the market's checks have not passed
  for (int k = 0; k < 3; ++k) {
    const int64_t id = r.windows[static_cast<size_t>(k)].claim->id;
    ASSERT_TRUE(store_
                    ->RecordCheck(id, kvasir::testing::Hex(keys_[k]), "127.0.0.1:7001", epoch,
                                  Status::Ok(), now)
                    .ok());
  }
  r = Beat(store_.get(), 0, a->claim.id, epoch, now += 0.1);
  EXPECT_TRUE(r.ready);
  EXPECT_DOUBLE_EQ(r.windows[0].claim->serving_since, served_from);  // kept while it serves
  // A holder released through the other process: gone at the next heartbeat, the epoch moved.
  ASSERT_TRUE(other_->Release(kvasir::testing::Hex(keys_[2]), c->claim.id, now += 0.1).ok());
  r = Beat(store_.get(), 0, a->claim.id, epoch, now += 0.1);
  EXPECT_FALSE(r.windows[2].claim.has_value());
  EXPECT_NE(r.epoch, epoch);
  EXPECT_FALSE(r.complete);
}

TEST_F(PipelinedHeartbeatTest, WhatItDoesNotHandleGoesTheGeneralWay) {
  double now = kT0;
  auto a = store_->Claim(Request(0, 0, 0), now, 30);
  ASSERT_TRUE(a.ok()) << a.status().message();
  const std::string node = kvasir::testing::Hex(keys_[0]);
  (void)Beat(store_.get(), 0, a->claim.id, -1, now += 0.1);
  // Another node's claim: refused as by the general path.
  auto stolen = store_->Heartbeat(kvasir::testing::Hex(keys_[1]), a->claim.id, -1, now += 0.1, 30);
  EXPECT_EQ(stolen.status().code(), StatusCode::kForbidden);
  // A claim whose lease ended is swept first: gone.
  auto b = other_->Claim(Request(1, 1, 0), now, 1);
  ASSERT_TRUE(b.ok()) << b.status().message();
  const uint64_t before = store_->pipelined_heartbeats();
  auto gone = store_->Heartbeat(kvasir::testing::Hex(keys_[1]), b->claim.id, -1, now + 1.5, 30);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound) << gone.status().message();
  EXPECT_EQ(store_->pipelined_heartbeats(), before);
  // A nonce used through the other process is refused as a replay, and the claim kept.
  const RequestNonce nonce{"00112233445566778899aabbccddeeff", 120};
  now += 1.6;
  ASSERT_TRUE(other_->Heartbeat(node, a->claim.id, -1, now, 30, nullptr, &nonce).ok());
  auto replay = store_->Heartbeat(node, a->claim.id, -1, now + 0.1, 30, nullptr, &nonce);
  EXPECT_EQ(replay.status().code(), StatusCode::kUnauthenticated) << replay.status().message();
  (void)Beat(store_.get(), 0, a->claim.id, -1, now + 0.2);
}

}  // namespace
}  // namespace kvasir::market
