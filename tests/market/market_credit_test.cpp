// Credit is bounded by what a real ring could have run (docs/MARKET.md, "Credit is bounded"):
// the attacks of a party that holds every window of a ring with free keys and signs its own
// receipts, replayed, and what the market credits for them; a client's signed count of the tokens
// it received, which caps the credit, and forged, replayed and inflated counts. Also demand, which
// only answered requests confirmed by sessions raise.
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
// A ring that serves, and receipts that carry a client's signed count.
class ClientCountCreditTest : public CreditTest {
 protected:
  void SetUp() override {
    CreditTest::SetUp();
    MakeReady(FillRing(kT0), kT0);
  }
  // `r` with `client` in it, its lines signed again by the ring's holders.
  ring::Receipt WithClient(ring::Receipt r, const ring::ClientCount& client) {
    const std::vector<ring::ReceiptLine> lines = r.lines;
    r.lines.clear();
    r.client = client;
    for (size_t w = 0; w < lines.size(); ++w) {
      ring::AppendReceiptLine(&r, keys_[w], lines[w].first, lines[w].last, lines[w].tokens,
                              lines[w].rows_root);
    }
    return r;
  }
  // Session `n` of `tokens` rows whose client (KeyN(40)) signs `client_tokens`.
  ring::Receipt Signed(uint64_t tokens, uint32_t n, uint64_t client_tokens) {
    ring::Receipt r = Session(tokens, n);
    return WithClient(r,
                      ring::SignClientCount(client_, r.id, r.model_id, r.session, client_tokens));
  }
  // The credit of one plain session of 20 rows, on a fresh session id.
  double PlainCredit(uint32_t n, double now) {
    const double before = TotalCredit(now);
    EXPECT_EQ(Submit(Session(20, n), now).status, 200);
    return TotalCredit(now) - before;
  }
  const ring::NodeKey client_ = kvasir::testing::KeyN(40);
};

TEST_F(ClientCountCreditTest, TheSmallerOfTheRingsAndTheClientsCountIsCredited) {
  const double now = kT0 + 100;
  const double plain = PlainCredit(1, now);
  ASSERT_GT(plain, 0.0);
  // The client received 12 of the ring's 20: 12 are credited.
  double before = TotalCredit(now);
  ApiResponse r = Submit(Signed(20, 2, 12), now);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NEAR(TotalCredit(now) - before, plain * 12 / 20, 1e-6);
  // An inflated count (50 for a ring's 20) earns no more than the ring's own count.
  before = TotalCredit(now);
  r = Submit(Signed(20, 3, 50), now);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NEAR(TotalCredit(now) - before, plain, 1e-6);
  // A client that says it received nothing makes the session earn nothing.
  before = TotalCredit(now);
  EXPECT_EQ(Submit(Signed(20, 4, 0), now).status, 422);
  EXPECT_EQ(TotalCredit(now), before);
}

TEST_F(ClientCountCreditTest, ForgedAndReplayedCountsAreRefused) {
  const double now = kT0 + 100;
  const double before = TotalCredit(now);
  // Forged: the count names the client's key, but another key signed it.
  ring::Receipt r = Session(20, 5);
  ring::ClientCount forged = ring::SignClientCount(keys_[6], r.id, r.model_id, r.session, 20);
  forged.client = client_.public_key();
  ApiResponse a = Submit(WithClient(r, forged), now);
  EXPECT_EQ(a.status, 422);
  EXPECT_NE(Reason(a).find("client count (20 tokens"), std::string::npos) << Reason(a);
  // Altered: a good signature over 12 tokens, with 20 written in.
  ring::ClientCount altered = ring::SignClientCount(client_, r.id, r.model_id, r.session, 12);
  altered.tokens = 20;
  EXPECT_EQ(Submit(WithClient(r, altered), now).status, 422);
  // Replayed: a good count of session 6 carried by session 7.
  const ring::Receipt six = Signed(20, 6, 20);
  ring::Receipt seven = Session(20, 7);
  a = Submit(WithClient(seven, *six.client), now);
  EXPECT_EQ(a.status, 422);
  EXPECT_NE(Reason(a).find("does not verify for this session"), std::string::npos) << Reason(a);
  EXPECT_EQ(TotalCredit(now), before);
  // The refusals credited nothing and left the sessions' ids free: the honest receipts go through.
  EXPECT_EQ(Submit(six, now).status, 200);
  EXPECT_EQ(
      Submit(WithClient(r, ring::SignClientCount(client_, r.id, r.model_id, r.session, 20)), now)
          .status,
      200);
}

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
