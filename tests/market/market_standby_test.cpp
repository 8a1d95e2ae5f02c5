// Standbys (docs/MARKET.md, "Standbys"): a node stands by for a held window, the map lists it,
// the neighbours of the window learn it from their heartbeats (to dial and accept it), a window
// whose claim is gone goes to its oldest proven standby that answered the market's check before any
// new claimer, and a standby that does not prove its bytes or serve is evicted like any claim.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <utility>

#include "market_fixture.h"
#include "market_test_util.h"
#include "relay/edge_token.h"

namespace kvasir::market {
namespace {

using kvasir::testing::Body;
using kvasir::testing::Hex;
using kvasir::testing::Signed;
using nlohmann::json;

class StandbyTest : public MarketFixture {
 protected:
  ApiResponse StandBy(const ring::NodeKey& k, int window, double now) {
    return Claim(k, window, now, json::object({{"standby", true}}));
  }
  int64_t StandById(const ring::NodeKey& k, int window, double now) {
    ApiResponse r = StandBy(k, window, now);
    EXPECT_EQ(r.status, 201) << r.body;
    EXPECT_TRUE(Body(r)["standby"].get<bool>()) << r.body;
    return Body(r)["claim"].get<int64_t>();
  }
  json Window(double now, int w) { return RingJson(now)["windows"][static_cast<size_t>(w)]; }
};

TEST_F(StandbyTest, AStandbyThatTookAWindowsPlaceSignsItsSessionsForCredit) {
  const auto ids = FillRing(kT0);
  StandById(keys_[3], 1, kT0);
  MakeReady(ids, kT0);
  // Window 1's stage died and the standby served the sessions since, before the market gave it
  // the window: its line is credited to it.
  ring::Receipt r = kvasir::testing::SignedReceipt({}, 20);
  r.id.fill(0x7a);
  for (int w = 0; w < 3; ++w) {
    ring::AppendReceiptLine(&r, keys_[w == 1 ? 3 : w], static_cast<uint32_t>(2 * w),
                            static_cast<uint32_t>(2 * w + 2), 20, ring::Digest{});
  }
  ApiResponse ok = Submit(r, kT0 + 10);
  ASSERT_EQ(ok.status, 200) << ok.body;
  json b = Body(api_->Handle(kvasir::testing::Plain("GET", "/v1/balances"), kT0 + 10));
  bool credited = false;
  for (const auto& x : b["balances"]) credited |= x["node"] == Hex(keys_[3]);
  EXPECT_TRUE(credited) << b;
  // A key that is neither the holder nor a standby of the window is refused.
  ring::Receipt bad = kvasir::testing::SignedReceipt({}, 20);
  bad.id.fill(0x7b);
  for (int w = 0; w < 3; ++w) {
    ring::AppendReceiptLine(&bad, keys_[w == 1 ? 5 : w], static_cast<uint32_t>(2 * w),
                            static_cast<uint32_t>(2 * w + 2), 20, ring::Digest{});
  }
  ApiResponse refused = Submit(bad, kT0 + 10);
  EXPECT_EQ(refused.status, 422);
  EXPECT_NE(Reason(refused).find("does not hold window 1"), std::string::npos) << Reason(refused);
}

// A SQLite database made before standbys (claims UNIQUE per window) keeps its claims and takes
// standbys once opened. (PostgreSQL: the next test.)
TEST_F(StandbyTest, AnOlderSqliteDatabaseKeepsItsClaimsAndTakesStandbys) {
  if (kvasir::testing::PostgresStore()) GTEST_SKIP() << "a SQLite database's migration";
  const auto ids = FillRing(kT0);
  api_.reset();
  store_.reset();
  {
    // The claims table as it was: the same rows, without the standby column.
    auto db = Db::Open(db_);
    ASSERT_TRUE(db.ok()) << db.status().message();
    for (const char* sql :
         {"CREATE TABLE old AS SELECT id, model, ring, window, node, address, behind_nat, rate, "
          "created, expires, last_beat, serving_epoch, serving_since, verified_epoch, verified_at, "
          "check_error, proven, proof_nonce, proof_picks FROM claims",
          "DROP TABLE claims",
          "CREATE TABLE claims(id INTEGER PRIMARY KEY AUTOINCREMENT, model INT NOT NULL "
          "REFERENCES models(id) ON DELETE CASCADE, ring INT NOT NULL, window INT NOT NULL, node "
          "TEXT NOT NULL, address TEXT NOT NULL, behind_nat INT NOT NULL, rate REAL NOT NULL, "
          "created REAL NOT NULL, expires REAL NOT NULL, last_beat REAL NOT NULL, serving_epoch "
          "INT NOT NULL DEFAULT -1, serving_since REAL NOT NULL DEFAULT 0, verified_epoch INT NOT "
          "NULL DEFAULT -1, verified_at REAL NOT NULL DEFAULT 0, check_error TEXT NOT NULL "
          "DEFAULT '', proven INT NOT NULL DEFAULT 1, proof_nonce TEXT NOT NULL DEFAULT '', "
          "proof_picks TEXT NOT NULL DEFAULT '', UNIQUE(model, ring, window), UNIQUE(node))",
          "INSERT INTO claims SELECT * FROM old", "DROP TABLE old"}) {
      ASSERT_TRUE((*db)->Exec(sql).ok()) << sql;
    }
  }
  Reopen();
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(Window(kT0 + 1, w)["claim"], ids[static_cast<size_t>(w)]);
    EXPECT_EQ(Window(kT0 + 1, w)["holder"], Hex(keys_[w]));
  }
  StandById(keys_[3], 1, kT0 + 1);
  StandById(keys_[4], 1, kT0 + 1);
  EXPECT_EQ(Window(kT0 + 1, 1)["standbys"].size(), 2u);
}

// The same for a PostgreSQL database: its claims table as a market before standbys made it (no
// standby column, UNIQUE(model, ring, "window") under the name PostgreSQL gave it, the triggers
// of the held counts on inserts and deletes only) keeps its claims, takes standbys and promotes
// one, its held count following. On the test's PostgreSQL server in either run of the tests.
TEST_F(StandbyTest, AnOlderPostgresDatabaseKeepsItsClaimsAndTakesStandbys) {
  std::string why;
  kvasir::testing::PgServer* pg = kvasir::testing::PgServer::Shared(&why);
  if (pg == nullptr) KV_SKIP_OR_FAIL("PostgreSQL: " + why);
  api_.reset();
  store_.reset();
  db_ = pg->NewDatabase();
  ASSERT_FALSE(db_.empty()) << "cannot create a database on the test server";
  {
    auto s = Store::Open(db_);
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_ = std::move(s).value();
    ASSERT_TRUE(store_->AddModel(kvasir::testing::TestModel(), false, kT0).ok());
    MakeApi({});
  }
  const auto ids = FillRing(kT0);
  api_.reset();
  store_.reset();
  {
    auto db = Db::Open(db_);
    ASSERT_TRUE(db.ok()) << db.status().message();
    for (const char* sql :
         {"DROP TRIGGER claims_held ON claims", "DROP INDEX claims_standby",
          "ALTER TABLE claims DROP COLUMN standby",  // and the UNIQUE constraint naming it
          "ALTER TABLE claims ADD UNIQUE(model, ring, \"window\")",
          "CREATE TRIGGER claims_held AFTER INSERT OR DELETE ON claims FOR EACH ROW EXECUTE "
          "FUNCTION claims_held()"}) {
      Status s = (*db)->Exec(sql);
      ASSERT_TRUE(s.ok()) << sql << ": " << s.message();
    }
    // It is the old table: a second claim of a window is refused by the old constraint.
    Status dup = (*db)->Exec(
        "INSERT INTO claims(model, ring, \"window\", node, address, behind_nat, rate, created, "
        "expires, last_beat) SELECT model, ring, \"window\", 'x', '', 0, 1, 0, 0, 0 FROM claims "
        "LIMIT 1");
    ASSERT_FALSE(dup.ok());
  }
  Reopen();
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(Window(kT0 + 1, w)["claim"], ids[static_cast<size_t>(w)]);
    EXPECT_EQ(Window(kT0 + 1, w)["holder"], Hex(keys_[w]));
  }
  const int64_t s1 = StandById(keys_[3], 1, kT0 + 1);
  StandById(keys_[4], 1, kT0 + 1);
  EXPECT_EQ(Window(kT0 + 1, 1)["standbys"].size(), 2u);
  // Promoted: the window stays held (the count follows the standby column).
  const int64_t epoch = RingJson(kT0 + 1)["epoch"].get<int64_t>();
  ASSERT_EQ(Beat(keys_[3], s1, epoch, kT0 + 2).status, 200);
  checks_.Answer(store_.get(), kT0 + 2);
  ASSERT_EQ(
      api_->Handle(Signed(keys_[1], "DELETE", "/v1/claims/" + std::to_string(ids[1]), "", kT0 + 3),
                   kT0 + 3)
          .status,
      200);
  EXPECT_EQ(Window(kT0 + 3, 1)["claim"], s1);
  // With window 2 released, one window of three is uncovered, as its rate says.
  ASSERT_EQ(
      api_->Handle(Signed(keys_[2], "DELETE", "/v1/claims/" + std::to_string(ids[2]), "", kT0 + 4),
                   kT0 + 4)
          .status,
      200);
  EXPECT_DOUBLE_EQ(Window(kT0 + 4, 2)["rate"].get<double>(), RewardRate(0, 1, 3));
}

// Opens its own market (eviction deadlines, windows with samples to prove).
class StandbyEvictTest : public StandbyTest {
 protected:
  void SetUp() override {}
};

TEST_F(StandbyTest, AStandbyIsOnTheMapAndItsWindowsNeighboursLearnIt) {
  const auto ids = FillRing(kT0);
  const int64_t epoch = RingJson(kT0)["epoch"].get<int64_t>();
  const int64_t s = StandById(keys_[3], 1, kT0);
  // The window keeps its holder; the standby is listed beside it, and the ring's epoch stays.
  json w = Window(kT0, 1);
  EXPECT_EQ(w["holder"], Hex(keys_[1]));
  ASSERT_EQ(w["standbys"].size(), 1u) << w;
  EXPECT_EQ(w["standbys"][0]["node"], Hex(keys_[3]));
  EXPECT_EQ(w["standbys"][0]["claim"], s);
  EXPECT_EQ(w["standbys"][0]["address"], "10.0.0.7:7001");
  EXPECT_EQ(RingJson(kT0)["epoch"], epoch);
  EXPECT_EQ(Window(kT0, 0)["standbys"].size(), 0u);
  // The predecessor of window 1 dials it, the successor accepts it.
  json pred = Body(Beat(keys_[0], ids[0], -1, kT0 + 1));
  ASSERT_EQ(pred["next_standbys"].size(), 1u) << pred;
  EXPECT_EQ(pred["next_standbys"][0]["node"], Hex(keys_[3]));
  EXPECT_EQ(pred["next_standbys"][0]["address"], "10.0.0.7:7001");
  EXPECT_EQ(pred["pred_standbys"].size(), 0u);
  EXPECT_FALSE(pred["standby"].get<bool>());
  json next = Body(Beat(keys_[2], ids[2], -1, kT0 + 1));
  ASSERT_EQ(next["pred_standbys"].size(), 1u) << next;
  EXPECT_EQ(next["pred_standbys"][0]["node"], Hex(keys_[3]));
  EXPECT_EQ(next["next_standbys"].size(), 0u);
  // The standby itself learns the neighbours of its window.
  json self = Body(Beat(keys_[3], s, -1, kT0 + 1));
  EXPECT_TRUE(self["standby"].get<bool>());
  EXPECT_EQ(self["pred"]["node"], Hex(keys_[0]));
  EXPECT_EQ(self["next"]["node"], Hex(keys_[2]));
}

TEST_F(StandbyTest, AStandbyNeedsAHeldWindowOtherThanTheHeadAndHoldsNothingElse) {
  ASSERT_EQ(Claim(keys_[0], 0, kT0).status, 201);
  ApiResponse r = StandBy(keys_[3], 1, kT0);  // window 1 is uncovered
  EXPECT_EQ(r.status, 409);
  EXPECT_NE(Reason(r).find("uncovered: claim it rather than stand by for it"), std::string::npos)
      << Reason(r);
  r = StandBy(keys_[3], 0, kT0);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(Reason(r).find("it has no standbys"), std::string::npos) << Reason(r);
  ASSERT_EQ(Claim(keys_[1], 1, kT0).status, 201);
  EXPECT_EQ(StandBy(keys_[1], 1, kT0).status, 409);  // it holds the window
  EXPECT_EQ(StandBy(keys_[0], 1, kT0).status, 409);  // it holds another claim
  const int64_t s = StandById(keys_[3], 1, kT0);
  EXPECT_EQ(StandBy(keys_[3], 1, kT0 + 1).status, 200);  // renewed
  EXPECT_EQ(Claim(keys_[3], 2, kT0 + 1).status, 409);    // a standby is its one claim
  // Two standbys of one window are listed oldest first.
  StandById(keys_[4], 1, kT0 + 1);
  json w = Window(kT0 + 1, 1);
  ASSERT_EQ(w["standbys"].size(), 2u);
  EXPECT_EQ(w["standbys"][0]["claim"], s);
  EXPECT_EQ(w["standbys"][1]["node"], Hex(keys_[4]));
}

TEST_F(StandbyTest, AWindowTakesAtMostFourStandbysAndTheyCoverNothing) {
  ASSERT_EQ(Claim(keys_[1], 1, kT0).status, 201);
  // An uncovered window's rate counts the uncovered windows of the model: standbys are not held
  // windows, so windows 0 and 2 keep the rate they had.
  const json rate0 = Window(kT0, 0)["rate"];
  for (int k = 2; k < 6; ++k) StandById(keys_[k], 1, kT0);
  EXPECT_EQ(Window(kT0, 0)["rate"], rate0);
  EXPECT_EQ(Window(kT0, 2)["rate"], rate0);
  // Keys are free: a fifth would make every neighbour's heartbeat name one more.
  ApiResponse r = StandBy(keys_[6], 1, kT0);
  EXPECT_EQ(r.status, 409);
  EXPECT_NE(Reason(r).find("has 4 standbys already"), std::string::npos) << Reason(r);
  EXPECT_EQ(Window(kT0, 1)["standbys"].size(), 4u);
  EXPECT_EQ(StandBy(keys_[2], 1, kT0 + 1).status, 200);  // one of the four still renews
}

TEST_F(StandbyTest, AWindowWhoseLeaseLapsesGoesToItsOldestStandbyBeforeAnyClaimer) {
  const auto ids = FillRing(kT0);
  const int64_t s1 = StandById(keys_[3], 1, kT0);
  const int64_t s2 = StandById(keys_[4], 1, kT0);
  const int64_t epoch = RingJson(kT0)["epoch"].get<int64_t>();
  // Everyone but window 1's holder keeps beating (often enough that the market is never silent);
  // the standbys serve the ring's epoch (up, waiting to be adopted), and the market's checks of
  // them pass.
  for (double t = kT0 + 10; t <= kT0 + 31; t += 10) {
    for (int i : {0, 2}) ASSERT_EQ(Beat(keys_[i], ids[static_cast<size_t>(i)], -1, t).status, 200);
    ASSERT_EQ(Beat(keys_[3], s1, epoch, t).status, 200);
    ASSERT_EQ(Beat(keys_[4], s2, epoch, t).status, 200);
    checks_.Answer(store_.get(), t);
  }
  const double t = kT0 + 31;  // window 1's lease (30 s) has lapsed
  ApiResponse r = Claim(keys_[5], 1, t);
  EXPECT_EQ(r.status, 409) << r.body;
  json w = Window(t, 1);
  EXPECT_EQ(w["holder"], Hex(keys_[3]));
  EXPECT_EQ(w["claim"], s1);  // the standby's claim is the window's now
  ASSERT_EQ(w["standbys"].size(), 1u);
  EXPECT_EQ(w["standbys"][0]["node"], Hex(keys_[4]));
  EXPECT_GT(RingJson(t)["epoch"].get<int64_t>(), epoch);
  json self = Body(Beat(keys_[3], s1, -1, t));
  EXPECT_FALSE(self["standby"].get<bool>());
  EXPECT_EQ(Body(Beat(keys_[0], ids[0], -1, t))["next"]["node"], Hex(keys_[3]));
  EXPECT_EQ(Beat(keys_[1], ids[1], -1, t).status, 404);
  // Released: the next standby takes the window at once.
  ASSERT_EQ(
      api_->Handle(Signed(keys_[3], "DELETE", "/v1/claims/" + std::to_string(s1), "", t), t).status,
      200);
  EXPECT_EQ(Window(t, 1)["holder"], Hex(keys_[4]));
  EXPECT_EQ(Window(t, 1)["claim"], s2);
  EXPECT_EQ(Window(t, 1)["standbys"].size(), 0u);
}

TEST_F(StandbyTest, TheMarketDialsAStandbyAndSkipsOneThatDoesNotAnswer) {
  MarketConfig c;
  c.relay_url = "wss://relay.example.org";
  c.relay_secret = std::string(32, 's');
  MakeApi(c);
  const auto ids = FillRing(kT0);
  const int64_t s1 = StandById(keys_[3], 1, kT0);
  const int64_t s2 = StandById(keys_[4], 2, kT0);
  ApiResponse nat = Claim(keys_[5], 1, kT0, {{"standby", true}, {"behind_nat", true}});
  ASSERT_EQ(nat.status, 201) << nat.body;
  const int64_t s3 = Body(nat)["claim"].get<int64_t>();
  const int64_t epoch = RingJson(kT0)["epoch"].get<int64_t>();
  // Not dialed before it serves the ring's epoch (its stage is not up yet).
  ASSERT_EQ(Beat(keys_[3], s1, -1, kT0 + 1).status, 200);
  EXPECT_TRUE(checks_.jobs.empty());
  for (auto [k, s] : {std::pair{3, s1}, {4, s2}, {5, s3}}) {
    ASSERT_EQ(Beat(keys_[k], s, epoch, kT0 + 1).status, 200);
  }
  // Each is dialed once for the epoch: at its address, or behind NAT through the relay, as the
  // predecessor side of its check edge.
  std::map<int64_t, CheckJob> jobs;
  for (const CheckJob& j : checks_.jobs) jobs[j.claim] = j;
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_EQ(jobs[s1].address, "10.0.0.7:7001");
  EXPECT_EQ(jobs[s1].node, Hex(keys_[3]));
  EXPECT_TRUE(jobs[s1].via.empty());
  EXPECT_FALSE(jobs[s1].head);
  EXPECT_EQ(jobs[s3].via, fmt::format("wss://relay.example.org/edge/c{}", s3));
  const relay::EdgeToken want = relay::MakeEdgeToken(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(c.relay_secret.data()), 32),
      fmt::format("c{}", s3), relay::Role::kPredecessorSide);
  EXPECT_EQ(jobs[s3].token, want);
  // s1 (the oldest of window 1) does not answer; the others do.
  checks_.jobs.clear();
  for (const auto& [id, j] : jobs) {
    const Status outcome = id == s1 ? Error("10.0.0.7:7001: connection refused") : Status::Ok();
    ASSERT_TRUE(store_->RecordCheck(id, j.node, j.address, j.epoch, outcome, kT0 + 2).ok());
  }
  json w = Window(kT0 + 2, 1);
  ASSERT_EQ(w["standbys"].size(), 2u) << w;
  EXPECT_FALSE(w["standbys"][0]["checked"].get<bool>());
  EXPECT_EQ(w["standbys"][0]["check_error"], "10.0.0.7:7001: connection refused");
  EXPECT_TRUE(w["standbys"][1]["checked"].get<bool>());
  // Passed for this epoch: not dialed again; failed: dialed again on a later heartbeat.
  ASSERT_EQ(Beat(keys_[4], s2, epoch, kT0 + 3).status, 200);
  for (const CheckJob& j : checks_.jobs) EXPECT_NE(j.claim, s2);
  // Window 1's holder leaves: the standby that answered takes it, the other stays a standby.
  ASSERT_EQ(
      api_->Handle(Signed(keys_[1], "DELETE", "/v1/claims/" + std::to_string(ids[1]), "", kT0 + 4),
                   kT0 + 4)
          .status,
      200);
  w = Window(kT0 + 4, 1);
  EXPECT_EQ(w["claim"], s3);
  ASSERT_EQ(w["standbys"].size(), 1u);
  EXPECT_EQ(w["standbys"][0]["claim"], s1);
}

// A standby behind NAT is checked through an edge of its own, "c<claim>", which its stage keeps
// dialed whatever its links: once its window's predecessor adopted it, that predecessor holds
// their edge, and the relay would refuse the market there. Its heartbeat names the edge with
// the successor side's token; the market dials it as the predecessor side, once per epoch, and
// a standby that passed there is promoted when the window's claim goes.
TEST_F(StandbyTest, AStandbyBehindNatIsCheckedThroughAnEdgeOfItsOwnEveryEpoch) {
  MarketConfig c;
  c.relay_url = "wss://relay.example.org";
  c.relay_secret = std::string(32, 's');
  MakeApi(c);
  const auto ids = FillRing(kT0);
  ApiResponse nat = Claim(keys_[5], 1, kT0, {{"standby", true}, {"behind_nat", true}});
  ASSERT_EQ(nat.status, 201) << nat.body;
  const int64_t s = Body(nat)["claim"].get<int64_t>();
  const std::string edge = fmt::format("c{}", s);
  auto token = [&](relay::Role role) {
    return relay::MakeEdgeToken(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(c.relay_secret.data()), 32), edge,
        role);
  };
  auto jobs_for_standby = [&] {
    std::vector<CheckJob> out;
    for (const CheckJob& j : checks_.jobs) {
      if (j.claim == s) out.push_back(j);
    }
    return out;
  };
  int64_t epoch = RingJson(kT0)["epoch"].get<int64_t>();
  ApiResponse beat = Beat(keys_[5], s, epoch, kT0 + 1);
  ASSERT_EQ(beat.status, 200) << beat.body;
  // Its heartbeat names the edge, with its side's token.
  const json check = Body(beat)["check"];
  EXPECT_EQ(check["via"], "wss://relay.example.org/edge/" + edge) << beat.body;
  const relay::EdgeToken succ = token(relay::Role::kSuccessorSide);
  EXPECT_EQ(check["token"],
            ToHex(std::string_view(reinterpret_cast<const char*>(succ.data()), succ.size())));
  // The market dials it there as the other side.
  ASSERT_EQ(jobs_for_standby().size(), 1u);
  EXPECT_EQ(jobs_for_standby()[0].via, "wss://relay.example.org/edge/" + edge);
  EXPECT_EQ(jobs_for_standby()[0].token, token(relay::Role::kPredecessorSide));
  checks_.Answer(store_.get(), kT0 + 2);
  // A new epoch (window 2's holder leaves and comes back): dialed again on the same edge, which
  // does not depend on whether its predecessor adopted it.
  ASSERT_EQ(
      api_->Handle(Signed(keys_[2], "DELETE", "/v1/claims/" + std::to_string(ids[2]), "", kT0 + 3),
                   kT0 + 3)
          .status,
      200);
  ASSERT_EQ(Claim(keys_[2], 2, kT0 + 3).status, 201);
  const int64_t later = RingJson(kT0 + 3)["epoch"].get<int64_t>();
  ASSERT_EQ(Beat(keys_[5], s, later, kT0 + 4).status, 200);
  ASSERT_EQ(jobs_for_standby().size(), 1u);
  EXPECT_EQ(jobs_for_standby()[0].via, "wss://relay.example.org/edge/" + edge);
  EXPECT_EQ(jobs_for_standby()[0].epoch, later);
  checks_.Answer(store_.get(), kT0 + 4);
  json w = Window(kT0 + 4, 1);
  ASSERT_EQ(w["standbys"].size(), 1u) << w;
  EXPECT_TRUE(w["standbys"][0]["checked"].get<bool>()) << w;
  // Window 1's holder leaves: the standby takes its window.
  ASSERT_EQ(
      api_->Handle(Signed(keys_[1], "DELETE", "/v1/claims/" + std::to_string(ids[1]), "", kT0 + 5),
                   kT0 + 5)
          .status,
      200);
  EXPECT_EQ(Window(kT0 + 5, 1)["claim"], s);
}

// A standby behind NAT whose predecessor's window changes hands (after it was adopted, or before
// its first check) is checked on the same edge of its own: the new predecessor's edge, which
// that predecessor may hold, is never where the market dials. A holder gets no check edge.
TEST_F(StandbyTest, AStandbyBehindNatIsCheckedOnItsOwnEdgeWhenItsPredecessorChangesHands) {
  MarketConfig c;
  c.relay_url = "wss://relay.example.org";
  c.relay_secret = std::string(32, 's');
  MakeApi(c);
  const auto ids = FillRing(kT0);
  ApiResponse nat = Claim(keys_[5], 1, kT0, {{"standby", true}, {"behind_nat", true}});
  ASSERT_EQ(nat.status, 201) << nat.body;
  const int64_t s = Body(nat)["claim"].get<int64_t>();
  ASSERT_EQ(Beat(keys_[5], s, RingJson(kT0)["epoch"].get<int64_t>(), kT0 + 1).status, 200);
  // Its first check fails (as a dial to a predecessor's edge that was taken would).
  for (const CheckJob& j : checks_.jobs) {
    ASSERT_TRUE(
        store_->RecordCheck(j.claim, j.node, j.address, j.epoch, Error("role taken"), kT0 + 2)
            .ok());
  }
  checks_.jobs.clear();
  // Window 0 (the standby's predecessor) changes hands.
  ASSERT_EQ(
      api_->Handle(Signed(keys_[0], "DELETE", "/v1/claims/" + std::to_string(ids[0]), "", kT0 + 3),
                   kT0 + 3)
          .status,
      200);
  ApiResponse head = Claim(keys_[6], 0, kT0 + 3);
  ASSERT_EQ(head.status, 201) << head.body;
  const int64_t pred = Body(head)["claim"].get<int64_t>();
  const int64_t epoch = RingJson(kT0 + 3)["epoch"].get<int64_t>();
  ApiResponse beat = Beat(keys_[5], s, epoch, kT0 + 4);
  ASSERT_EQ(beat.status, 200);
  EXPECT_EQ(Body(beat)["pred"]["claim"], pred);
  EXPECT_EQ(Body(beat)["check"]["via"], fmt::format("wss://relay.example.org/edge/c{}", s));
  std::vector<std::string> vias;
  for (const CheckJob& j : checks_.jobs) {
    if (j.claim == s) vias.push_back(j.via);
  }
  ASSERT_EQ(vias.size(), 1u);
  EXPECT_EQ(vias[0], fmt::format("wss://relay.example.org/edge/c{}", s));
  // The new holder has no check edge.
  ApiResponse holder = Beat(keys_[6], pred, epoch, kT0 + 4);
  ASSERT_EQ(holder.status, 200);
  EXPECT_FALSE(Body(holder).contains("check")) << holder.body;
}

TEST_F(StandbyEvictTest, AStandbyThatDoesNotProveItsBytesIsEvictedAndNeverPromoted) {
  ModelSpec m = kvasir::testing::TestModel();
  for (auto& ring : m.rings) {
    for (auto& w : ring) {
      RangeSample s;
      s.range = {w.tensors[0].name, 0, 16};
      s.bytes = std::string(16, 'x');
      w.samples.push_back(s);
    }
  }
  MarketConfig c;
  c.lease_s = 300;
  c.eviction.deadline_s = 10;
  c.eviction.floor_bytes_per_s = 1e15;
  c.eviction.cooldown_s = 30;
  Open(m, c);
  const auto ids = FillRing(kT0);
  const int64_t s = StandById(keys_[3], 1, kT0);
  json beat = Body(Beat(keys_[3], s, -1, kT0 + 1));
  EXPECT_TRUE(beat.contains("challenge")) << beat;  // the same challenge as any claim
  // Window 1's holder leaves: the unproven standby is not given the window.
  ASSERT_EQ(
      api_->Handle(Signed(keys_[1], "DELETE", "/v1/claims/" + std::to_string(ids[1]), "", kT0 + 2),
                   kT0 + 2)
          .status,
      200);
  EXPECT_EQ(Window(kT0 + 2, 1)["state"], "uncovered");
  EXPECT_EQ(Window(kT0 + 2, 1)["standbys"].size(), 1u);
  // At its deadline it is evicted, and cools down like a claimer.
  EXPECT_EQ(Window(kT0 + 11, 1)["standbys"].size(), 0u);
  EXPECT_EQ(Beat(keys_[3], s, -1, kT0 + 11).status, 404);
  ApiResponse r = StandBy(keys_[3], 2, kT0 + 12);
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(Reason(r).find("evicted 1 time(s)"), std::string::npos) << Reason(r);
}

}  // namespace
}  // namespace kvasir::market
