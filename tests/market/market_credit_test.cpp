// Credit is bounded by what a real ring could have run (docs/MARKET.md, "Credit is bounded"):
// the attacks of a party that holds every window of a ring with free keys and signs its own
// receipts, replayed, and what the market credits for them. Also demand, which only answered
// requests confirmed by sessions raise.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "market/sql.h"
#include "market_fixture.h"
#include "market_test_util.h"

namespace kvasir::market {
namespace {

using kvasir::testing::Body;
using kvasir::testing::Plain;
using nlohmann::json;

// Leases long enough that nothing expires while the tests move the clock by hours.
class CreditTest : public MarketFixture {
 protected:
  void SetUp() override {
    Open(kvasir::testing::TestModel(), MarketConfig{7200, 120, "", "", {}, {}});
  }
};

TEST_F(CreditTest, ASessionEarnsForNoMoreRowsThanTheContext) {
  const auto ids = FillRing(kT0);
  MakeReady(ids, kT0);
  uint32_t n = 1;
  for (uint64_t tokens : {uint64_t{257}, uint64_t{1} << 63, ~uint64_t{0}}) {
    ApiResponse r = Submit(Session(tokens, n++), kT0 + 100);
    EXPECT_EQ(r.status, 422) << tokens;
    EXPECT_NE(Reason(r).find("runs at most its context of 256"), std::string::npos) << Reason(r);
  }
  EXPECT_EQ(TotalCredit(kT0 + 100), 0.0);
  // A session of the whole context is fine.
  EXPECT_EQ(Submit(Session(256, n), kT0 + 100).status, 200);
}

TEST_F(CreditTest, ClaimsThatNeverServedEarnNothing) {
  const auto ids = FillRing(kT0);
  // Claimed, never a heartbeat.
  ApiResponse r = Submit(Session(20, 1), kT0 + 10);
  EXPECT_EQ(r.status, 422);
  EXPECT_NE(Reason(r).find("is not ready"), std::string::npos) << Reason(r);
  EXPECT_NE(Reason(r).find("does not serve epoch"), std::string::npos) << Reason(r);
  // Every holder says it serves, but the market could not check them.
  const int64_t epoch = RingJson(kT0 + 11)["epoch"].get<int64_t>();
  for (int w = 0; w < 3; ++w) ASSERT_EQ(Beat(keys_[w], ids[w], epoch, kT0 + 11).status, 200);
  checks_.Answer(store_.get(), kT0 + 11, Error("10.0.0.7:7001: connection refused"));
  r = Submit(Session(20, 2), kT0 + 20);
  EXPECT_EQ(r.status, 422);
  EXPECT_NE(Reason(r).find("has not checked window 0's holder"), std::string::npos) << Reason(r);
  EXPECT_NE(Reason(r).find("connection refused"), std::string::npos) << Reason(r);
  EXPECT_EQ(TotalCredit(kT0 + 20), 0.0);
}

TEST_F(CreditTest, ASessionCannotHaveRunBeforeTheRingWasReady) {
  MarketConfig config{7200, 120, "", "", {}, {}};
  config.eviction.deadline_s = 1000;  // the holders take 100 s to serve, and are not evicted
  MakeApi(config);
  const auto ids = FillRing(kT0);
  MakeReady(ids, kT0 + 100);
  // Ready for 0.125 s at 1000 rows/s: 125 rows at most.
  ApiResponse r = Submit(Session(200, 1), kT0 + 100.125);
  EXPECT_EQ(r.status, 422);
  EXPECT_NE(Reason(r).find("can have run 125 more rows, not 200"), std::string::npos) << Reason(r);
  EXPECT_EQ(Submit(Session(90, 2), kT0 + 100.125).status, 200);
  EXPECT_EQ(Submit(Session(90, 3), kT0 + 100.125).status, 422);  // 35 left
}

// The replay of "900 invented receipts credited in 3 s": a ring ready for 3 s at 1000 rows/s
// earns for at most 3000 rows, whatever is submitted, and a forged receipt spends nothing.
TEST_F(CreditTest, InventedReceiptsEarnNoMoreThanTheRingCouldHaveRun) {
  const auto ids = FillRing(kT0);
  MakeReady(ids, kT0);
  const double now = kT0 + 3;
  ring::Receipt forged = Session(256, 1);
  forged.lines[1].signature[0] ^= 1;
  EXPECT_EQ(Submit(forged, now).status, 422);
  int accepted = 0;
  for (uint32_t i = 0; i < 900; ++i) {
    ApiResponse a = Submit(Session(256, 1000 + i), now);
    if (a.status == 200)
      ++accepted;
    else
      EXPECT_NE(Reason(a).find("can have run"), std::string::npos) << Reason(a);
  }
  EXPECT_EQ(accepted, 3000 / 256);
  // Credit: rows x layers x each window's locked rate, nothing beyond 3000 rows.
  json b = Body(api_->Handle(Plain("GET", "/v1/balances"), now));
  uint64_t work = 0;
  for (const auto& x : b["balances"]) work += x["work"].get<uint64_t>();
  EXPECT_EQ(work, uint64_t{3000 / 256} * 256 * 6);
  EXPECT_LE(TotalCredit(now), 3000.0 * (2 * 2.0 + 2 * 1.667 + 2 * 1.333) + 1e-6);

  // Later the allowance has grown, but never past kCreditBurstSeconds of the rate.
  const double later = now + 3600;
  accepted = 0;
  for (uint32_t i = 0; i < 300; ++i) {
    if (Submit(Session(256, 5000 + i), later).status == 200) ++accepted;
  }
  EXPECT_EQ(accepted, static_cast<int>(1000 * kCreditBurstSeconds) / 256);
}

TEST_F(CreditTest, ANewSetOfHoldersStartsWithNoAllowance) {
  auto ids = FillRing(kT0);
  MakeReady(ids, kT0);
  ASSERT_EQ(Submit(Session(256, 1), kT0 + 50).status, 200);
  // Window 2 changes hands: a new epoch, a new ring as far as credit goes.
  ASSERT_EQ(
      api_->Handle(kvasir::testing::Signed(keys_[2], "DELETE",
                                           "/v1/claims/" + std::to_string(ids[2]), "", kT0 + 51),
                   kT0 + 51)
          .status,
      200);
  ids[2] = Body(Claim(keys_[2], 2, kT0 + 52))["claim"].get<int64_t>();
  MakeReady(ids, kT0 + 53);
  ApiResponse r = Submit(Session(200, 2), kT0 + 53.125);
  EXPECT_EQ(r.status, 422);
  EXPECT_NE(Reason(r).find("can have run 125 more rows"), std::string::npos) << Reason(r);
}

TEST_F(CreditTest, ABalanceThatWouldOverflowRefusesTheReceipt) {
  const auto ids = FillRing(kT0);
  MakeReady(ids, kT0);
  ASSERT_EQ(Submit(Session(20, 1), kT0 + 10).status, 200);
  {
    // A balance at the edge of what the ledger can count.
    auto db = Db::Open(db_);
    ASSERT_TRUE(db.ok());
    auto s = (*db)->Prepare("UPDATE balances SET work = ? WHERE node = ?");
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(s->Bind(1, std::numeric_limits<int64_t>::max() - 10)
                    .Bind(2, kvasir::testing::Hex(keys_[1]))
                    .Run()
                    .ok());
  }
  ApiResponse r = Submit(Session(20, 2), kT0 + 20);
  EXPECT_EQ(r.status, 422);
  EXPECT_NE(Reason(r).find("overflows"), std::string::npos) << Reason(r);
  // Nothing of it was kept: not the receipt, not the other lines' credit.
  json b = Body(api_->Handle(Plain("GET", "/v1/balances"), kT0 + 20));
  EXPECT_EQ(b["receipts"].size(), 1u);
  for (const auto& x : b["balances"]) EXPECT_EQ(x["receipts"], 1);
}

// The replay of "one GET /v1/rings from each of 60 addresses raised an uncovered window's rate
// from 3.0 to the cap": requests no ring could answer count for nothing, and answered ones only
// as far as sessions with receipts confirm them.
class DemandTest : public MarketFixture {
 protected:
  void SetUp() override {
    Open(kvasir::testing::TestModel("tiny", 2), MarketConfig{7200, 120, "", "", {}, {}});
  }
  void AskFrom(int addresses, double now) {
    for (int i = 0; i < addresses; ++i) {
      ApiRequest r = Plain("GET", "/v1/rings/tiny");
      r.remote_ip = "10.1." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
      (void)api_->Handle(r, now);
    }
  }
  double UncoveredRate(double now) { return RingJson(now, 1)["windows"][0]["rate"].get<double>(); }
};

TEST_F(DemandTest, OnlyAnsweredRequestsConfirmedBySessionsRaiseTheReward) {
  EXPECT_DOUBLE_EQ(UncoveredRate(kT0), 2.0);  // everything uncovered, no demand
  AskFrom(60, kT0);                           // all 503: no ring is ready
  EXPECT_DOUBLE_EQ(UncoveredRate(kT0), 2.0);
  EXPECT_EQ(Map(kT0)["models"][0]["demand"]["total"], 0);

  const auto ids = FillRing(kT0 + 1, 0);
  MakeReady(ids, kT0 + 1, 0);
  EXPECT_DOUBLE_EQ(UncoveredRate(kT0 + 1), 1.5);  // half the windows uncovered
  AskFrom(60, kT0 + 2);                           // answered, but no session followed
  json demand = Map(kT0 + 2)["models"][0]["demand"];
  EXPECT_EQ(demand["requests"], 60);
  EXPECT_EQ(demand["sessions"], 0);
  EXPECT_EQ(demand["recent"], 0);
  EXPECT_DOUBLE_EQ(UncoveredRate(kT0 + 2), 1.5);
  // One address asking again and again is one request.
  for (int i = 0; i < 50; ++i) (void)api_->Handle(Plain("GET", "/v1/rings/tiny"), kT0 + 3);
  EXPECT_EQ(Map(kT0 + 3)["models"][0]["demand"]["requests"], 61);

  // 20 sessions with receipts confirm 20 of the requests: d = 2, the rate triples.
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(Submit(Session(20, static_cast<uint32_t>(i + 1), 0), kT0 + 4).status, 200);
  }
  demand = Map(kT0 + 4)["models"][0]["demand"];
  EXPECT_EQ(demand["sessions"], 20);
  EXPECT_EQ(demand["recent"], 20);
  EXPECT_DOUBLE_EQ(UncoveredRate(kT0 + 4), 4.5);
  // Ten minutes later it is all forgotten.
  EXPECT_DOUBLE_EQ(UncoveredRate(kT0 + 4 + kRecentSeconds + 1), 1.5);
}

}  // namespace
}  // namespace kvasir::market
