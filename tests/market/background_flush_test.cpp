// The flush written on a thread of its own (docs/MARKET.md, "The flush"): on SQLite the renewals
// waiting in memory are handed to a flush that writes them on its own connection while the
// store goes on answering; a heartbeat is not blocked by the flush's open transaction, sees its
// own renewal meanwhile, and a replay of it is refused; a general-path transaction waits for the
// flush's write lock instead of failing; a failed flush puts its renewals back, never shortening
// one renewed since.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "market_fixture.h"

namespace kvasir::market {
namespace {

// Holds the flush's transaction open (the flush's hook) until Release.
class Gate {
 public:
  Status Hold() {
    std::unique_lock<std::mutex> lock(mu_);
    held_ = true;
    cv_.notify_all();
    // Bounded: a test that never releases fails instead of hanging.
    cv_.wait_for(lock, std::chrono::seconds(20), [&] { return released_; });
    return released_ ? Status::Ok() : Error("the test never released the flush");
  }
  bool WaitHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return held_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false, released_ = false;
};

class BackgroundFlushTest : public MarketFixture {
 protected:
  void SetUp() override {
    Open(kvasir::testing::TestModel(), Config());
    if (HasFatalFailure() || IsSkipped()) return;
    auto on = store_->EnableBackgroundFlush();
    ASSERT_TRUE(on.ok()) << on.status().message();
    if (!*on) GTEST_SKIP() << "the flush has a thread of its own on SQLite only";
  }
  static MarketConfig Config() {
    MarketConfig c;
    c.lease_s = 30;
    c.lease_flush_s = 5;  // heartbeats never flush: the test takes each flush
    return c;
  }
  ApiRequest BeatRequest(int key, int64_t claim, double now) const {
    return kvasir::testing::Signed(keys_[key], "POST", "/v1/heartbeat",
                                   nlohmann::json{{"claim", claim}, {"serving_epoch", -1}}.dump(),
                                   now);
  }
};

TEST_F(BackgroundFlushTest, AHeartbeatIsAnsweredWhileTheFlushHoldsItsTransactionOpen) {
  const int64_t claim = ClaimWindow(0, 0, kT0);
  ASSERT_EQ(Beat(keys_[0], claim, -1, kT0 + 1).status, 200);
  ASSERT_EQ(store_->pending_leases(), 1u);
  Gate gate;
  store_->set_flush_hook([&] { return gate.Hold(); });
  const auto batch = store_->TakeLeaseFlush(kT0 + 6);
  ASSERT_NE(batch, nullptr);
  EXPECT_EQ(store_->pending_leases(), 0u);
  Status written;
  std::thread writer([&] { written = store_->WriteLeaseFlush(*batch); });
  ASSERT_TRUE(gate.WaitHeld());
  // The flush holds the database's write lock: this heartbeat only reads, and its answer has its
  // own renewal.
  const uint64_t read_only = store_->read_only_heartbeats();
  const ApiRequest beat = BeatRequest(0, claim, kT0 + 7);
  const ApiResponse r = api_->Handle(beat, kT0 + 7);
  const bool answered = r.status == 200;
  const double expires_in = answered ? kvasir::testing::Body(r)["expires_in"].get<double>() : 0;
  const ApiResponse replay = api_->Handle(beat, kT0 + 8);
  const uint64_t read_only_after = store_->read_only_heartbeats();
  gate.Release();
  writer.join();
  store_->EndLeaseFlush(written, kT0 + 9);
  ASSERT_TRUE(answered) << r.body;
  EXPECT_NEAR(expires_in, 30, 0.01);
  EXPECT_EQ(read_only_after, read_only + 1);
  EXPECT_EQ(replay.status, 401) << replay.body;
  ASSERT_TRUE(written.ok()) << written.message();
  // The flush wrote the first renewal; the second waits for the next.
  EXPECT_DOUBLE_EQ(Row(claim, kT0 + 9).expires, kT0 + 31);
  EXPECT_EQ(store_->pending_leases(), 1u);
  store_->set_flush_hook(nullptr);
  ASSERT_TRUE(api_->FlushLeases(kT0 + 10, /*force=*/true).ok());
  EXPECT_DOUBLE_EQ(Row(claim, kT0 + 10).expires, kT0 + 37);
  // Written, and after a restart: the replay is still refused.
  Reopen(Config());
  EXPECT_EQ(api_->Handle(beat, kT0 + 11).status, 401);
}

// A claim (a transaction that writes) meets the flush's write lock: it waits for the flush to
// commit, and both succeed.
TEST_F(BackgroundFlushTest, AWriteWaitsForTheFlushAndDoesNotFail) {
  const int64_t claim = ClaimWindow(0, 0, kT0);
  ASSERT_EQ(Beat(keys_[0], claim, -1, kT0 + 1).status, 200);
  Gate gate;
  store_->set_flush_hook([&] { return gate.Hold(); });
  const auto batch = store_->TakeLeaseFlush(kT0 + 6);
  ASSERT_NE(batch, nullptr);
  Status written;
  std::thread writer([&] { written = store_->WriteLeaseFlush(*batch); });
  ASSERT_TRUE(gate.WaitHeld());
  // Released while the claim waits for the lock (well within the 5 s busy timeout).
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    gate.Release();
  });
  const ApiResponse second = Claim(keys_[1], 1, kT0 + 7);
  releaser.join();
  writer.join();
  store_->EndLeaseFlush(written, kT0 + 8);
  EXPECT_EQ(second.status, 201) << second.body;
  EXPECT_TRUE(written.ok()) << written.message();
  EXPECT_DOUBLE_EQ(Row(claim, kT0 + 8).expires, kT0 + 31);
}

TEST_F(BackgroundFlushTest, AFailedFlushLosesNoRenewal) {
  const int64_t claim = ClaimWindow(0, 0, kT0);
  ASSERT_EQ(Beat(keys_[0], claim, -1, kT0 + 1).status, 200);
  store_->set_flush_hook([] { return Error("test: the disk is full"); });
  const auto batch = store_->TakeLeaseFlush(kT0 + 6);
  ASSERT_NE(batch, nullptr);
  // Renewed while the flush is written (it fails): the later renewal is kept, not shortened.
  const ApiRequest beat = BeatRequest(0, claim, kT0 + 7);
  ASSERT_EQ(api_->Handle(beat, kT0 + 7).status, 200);
  const Status written = store_->WriteLeaseFlush(*batch);
  EXPECT_FALSE(written.ok());
  store_->EndLeaseFlush(written, kT0 + 8);
  ASSERT_EQ(store_->pending_leases(), 1u);
  EXPECT_DOUBLE_EQ(store_->waiting_leases().at(claim).expires, kT0 + 37);
  EXPECT_DOUBLE_EQ(Row(claim, kT0 + 8).expires, kT0 + 30);  // as claimed
  // Due again at once; written by the next flush.
  store_->set_flush_hook(nullptr);
  const auto again = store_->TakeLeaseFlush(kT0 + 8);
  ASSERT_NE(again, nullptr);
  const Status ok = store_->WriteLeaseFlush(*again);
  store_->EndLeaseFlush(ok, kT0 + 8);
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_EQ(store_->pending_leases(), 0u);
  EXPECT_DOUBLE_EQ(Row(claim, kT0 + 9).expires, kT0 + 37);
  EXPECT_DOUBLE_EQ(Row(claim, kT0 + 9).last_beat, kT0 + 7);
  Reopen(Config());
  EXPECT_EQ(api_->Handle(beat, kT0 + 10).status, 401);
}

// Within a second of the last housekeeping, a lease-only heartbeat goes the read-only way and
// answers what the map (the general path) shows right after it: its own renewal, another
// process's claim at once, the epoch; a heartbeat that changes its serving epoch goes the general
// way.
TEST_F(BackgroundFlushTest, AReadOnlyHeartbeatAnswersWhatTheMapShows) {
  auto other = Store::Open(db_);
  ASSERT_TRUE(other.ok()) << other.status().message();
  (*other)->set_lease_s(30);
  double now = kT0;
  auto a = store_->Claim(Request(0, 0, 0), now, 30);
  ASSERT_TRUE(a.ok()) << a.status().message();
  const std::string node = kvasir::testing::Hex(keys_[0]);
  ASSERT_TRUE(store_->Heartbeat(node, a->claim.id, -1, now += 1, 30).ok());  // housekeeping
  auto beat = [&](int64_t epoch, double at) -> uint64_t {
    const uint64_t before = store_->read_only_heartbeats();
    auto r = store_->Heartbeat(node, a->claim.id, epoch, at, 30);
    EXPECT_TRUE(r.ok()) << r.status().message();
    auto map = store_->Map(at);
    EXPECT_TRUE(map.ok()) << map.status().message();
    if (!r.ok() || !map.ok()) return 0;
    const RingState& want = (*map)[0].rings[0];
    EXPECT_EQ(r->ring.epoch, want.epoch);
    EXPECT_EQ(r->ring.complete, want.complete);
    EXPECT_DOUBLE_EQ(r->claim.expires, at + 30);
    for (size_t w = 0; w < want.windows.size(); ++w) {
      const auto& got = r->ring.windows[w].claim;
      EXPECT_EQ(got.has_value(), want.windows[w].claim.has_value()) << "window " << w;
      if (!got || !want.windows[w].claim) continue;
      EXPECT_EQ(got->id, want.windows[w].claim->id);
      // The heartbeat's own claim in its ring is as before it (as on the general path); its
      // renewal is in its claim (above).
      if (got->id == a->claim.id) continue;
      EXPECT_DOUBLE_EQ(got->expires, want.windows[w].claim->expires) << "window " << w;
      EXPECT_DOUBLE_EQ(got->last_beat, want.windows[w].claim->last_beat) << "window " << w;
      EXPECT_EQ(got->serving_epoch, want.windows[w].claim->serving_epoch);
    }
    return store_->read_only_heartbeats() - before;
  };
  EXPECT_EQ(beat(-1, now += 0.1), 1u);
  EXPECT_EQ(beat(-1, now += 0.1), 1u);
  // Another process claims window 1: the next heartbeat has it.
  auto b = (*other)->Claim(Request(1, 0, 1), now += 0.1, 30);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(beat(-1, now += 0.1), 1u);
  EXPECT_EQ(beat(0, now += 0.1), 0u);  // a new serving epoch is written at once
  EXPECT_EQ(beat(0, now += 0.1), 1u);
}

}  // namespace
}  // namespace kvasir::market
