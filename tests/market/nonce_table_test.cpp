// Heartbeat nonces in memory (docs/MARKET.md, "Nonces in memory"): with SQLite, a heartbeat's
// nonce waits in memory for the next flush instead of being written in its own transaction; a
// replay is refused while it waits, once it was written, and after a restart that followed a
// flush. PostgreSQL writes each at once (another process on the database must refuse it too).
#include "market/nonce_table.h"

#include <gtest/gtest.h>

#include "market_fixture.h"

namespace kvasir::market {
namespace {

TEST(NonceTableTest, RefusesANonceTwiceAndForgetsOnlyWhatWasWritten) {
  NonceTable t;
  EXPECT_TRUE(t.Add("a", "01", 100));
  EXPECT_FALSE(t.Add("a", "01", 101));  // used before: nothing recorded
  EXPECT_TRUE(t.Add("b", "01", 100));   // the same nonce of another node is another nonce
  EXPECT_TRUE(t.Add("a", "02", 102));
  EXPECT_EQ(t.size(), 3u);
  t.Written(2);
  EXPECT_FALSE(t.Contains("a", "01"));
  EXPECT_FALSE(t.Contains("b", "01"));
  EXPECT_TRUE(t.Contains("a", "02"));
  ASSERT_EQ(t.pending().size(), 1u);
  EXPECT_DOUBLE_EQ(t.pending()[0].expires, 102);
  t.Written(5);  // more than waits: all of it
  EXPECT_TRUE(t.empty());
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
};

TEST_F(HeartbeatNonceTest, AReplayIsRefusedInMemoryOnceWrittenAndAfterARestart) {
  const ApiResponse r = Claim(keys_[0], 0, kT0);
  ASSERT_EQ(r.status, 201) << r.body;
  const int64_t claim = kvasir::testing::Body(r)["claim"].get<int64_t>();
  const ApiRequest beat = kvasir::testing::Signed(
      keys_[0], "POST", "/v1/heartbeat",
      nlohmann::json{{"claim", claim}, {"serving_epoch", -1}}.dump(), kT0 + 5);
  ASSERT_EQ(api_->Handle(beat, kT0 + 5).status, 200);
  EXPECT_EQ(store_->pending_nonces(), Postgres() ? 0u : 1u);
  // Not yet written: refused from memory.
  EXPECT_EQ(api_->Handle(beat, kT0 + 6).status, 401);
  // The same nonce on another request of the node is refused as well.
  auto reused = store_->UseNonce(kvasir::testing::Hex(keys_[0]), beat.headers.at("x-kvasir-nonce"),
                                 kT0 + 6, 120);
  ASSERT_TRUE(reused.ok()) << reused.status().message();
  EXPECT_FALSE(*reused);
  // Written with the renewals: refused from the table.
  ASSERT_TRUE(api_->FlushLeases(kT0 + 7, /*force=*/true).ok());
  EXPECT_EQ(store_->pending_nonces(), 0u);
  EXPECT_EQ(api_->Handle(beat, kT0 + 8).status, 401);
  // A restart after the flush (as `kvasir market` stops) still refuses it.
  Reopen(Config());
  const ApiResponse again = api_->Handle(beat, kT0 + 9);
  EXPECT_EQ(again.status, 401) << again.body;
  EXPECT_NE(Reason(again).find("replayed"), std::string::npos) << Reason(again);
  // And the claim's last renewal is the first heartbeat's.
  auto map = store_->Map(kT0 + 9);
  ASSERT_TRUE(map.ok()) << map.status().message();
  ASSERT_TRUE((*map)[0].rings[0].windows[0].claim.has_value());
  EXPECT_DOUBLE_EQ((*map)[0].rings[0].windows[0].claim->last_beat, kT0 + 5);
}

// A heartbeat that fails records nothing: its replay fails for the same reason, not as a replay.
TEST_F(HeartbeatNonceTest, AFailedHeartbeatKeepsNoNonce) {
  const ApiResponse r = Claim(keys_[0], 0, kT0);
  ASSERT_EQ(r.status, 201) << r.body;
  const int64_t claim = kvasir::testing::Body(r)["claim"].get<int64_t>();
  const ApiRequest stolen = kvasir::testing::Signed(
      keys_[1], "POST", "/v1/heartbeat",
      nlohmann::json{{"claim", claim}, {"serving_epoch", -1}}.dump(), kT0 + 5);
  EXPECT_EQ(api_->Handle(stolen, kT0 + 5).status, 403);
  EXPECT_EQ(store_->pending_nonces(), 0u);
  EXPECT_EQ(api_->Handle(stolen, kT0 + 6).status, 403);
}

}  // namespace
}  // namespace kvasir::market
