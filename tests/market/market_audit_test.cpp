// Audits of credited work (docs/MARKET.md, "Audits"), through the API: a receipt picked for audit
// asks every holder, on its heartbeats, to reveal a few positions of the session; a reveal that
// matches the holder's signed commitment passes, while one that does not (rows other than those
// committed to), a refusal, or no answer in time forfeits the line's credit, evicts the holder's
// claim and bans its key for longer each time.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>

#include "market/audit.h"
#include "market/sql.h"
#include "market_fixture.h"
#include "market_test_util.h"
#include "ring/row_store.h"

namespace kvasir::market {
namespace {

using kvasir::testing::Body;
using nlohmann::json;

class AuditTest : public MarketFixture {
 protected:
  void SetUp() override { Open(kvasir::testing::TestModel(), Config()); }
  static MarketConfig Config() {
    MarketConfig c{7200, 120, "", "", {}, {}};
    c.audit.rate = 1;  // every credited session is audited
    c.audit.ban_s = 100;
    return c;
  }

  // The f32 row holder `w` gave out at position `p` of session `n`.
  static std::vector<uint8_t> OutRow(uint32_t n, int w, uint32_t p) {
    return std::vector<uint8_t>(16, static_cast<uint8_t>(n * p + 7 * w));
  }

  // What the holders of ring 0 ran for session `n`: `tokens` positions, the head taking in a
  // token and every other holder the row its predecessor gave out (unless it is `odd_in`, whose
  // inputs differ in one byte), kept in their row stores as a stage keeps them, and the receipt
  // they signed over their commitments.
  ring::Receipt RunSession(uint32_t n, uint64_t tokens = 20, int odd_in = -1) {
    ring::Receipt r;
    r.id.fill(0x7a);
    std::memcpy(r.id.data(), &n, sizeof(n));
    r.session = n;
    const std::string model_id = kvasir::testing::TestModel().model_id;
    for (size_t i = 0; i < r.model_id.size(); ++i) {
      r.model_id[i] = static_cast<uint8_t>(std::stoi(model_id.substr(2 * i, 2), nullptr, 16));
    }
    for (int w = 0; w < 3; ++w) {
      ring::SessionRows rows(stores_[w]);
      for (uint32_t p = 0; p < tokens; ++p) {
        ring::PositionRows pr;
        pr.pos = p;
        if (w == 0) {
          pr.in = {ring::RowKind::kToken, {static_cast<uint8_t>(p), 0, 0, 0}};
        } else {
          pr.in = {ring::RowKind::kF32, OutRow(n, w - 1, p)};
          if (w == odd_in) pr.in.bytes[5] ^= 1;
        }
        pr.out = {ring::RowKind::kF32, OutRow(n, w, p)};
        rows.Add(std::move(pr));
      }
      const ring::Digest root = rows.Root();
      stores_[w]->Put(n, std::move(rows));
      stores_[w]->Bind(n, root, r.id);
      ring::AppendReceiptLine(&r, keys_[w], static_cast<uint32_t>(2 * w),
                              static_cast<uint32_t>(2 * w + 2), tokens, root);
    }
    return r;
  }

  ApiResponse BeatWith(int w, int64_t claim, int64_t epoch, double now, const json& reveals) {
    json body = {{"claim", claim}, {"serving_epoch", epoch}};
    if (!reveals.empty()) body["reveals"] = reveals;
    return api_->Handle(
        kvasir::testing::Signed(keys_[w], "POST", "/v1/heartbeat", body.dump(), now), now);
  }

  // The audit requests holder `w`'s heartbeat gets.
  std::vector<AuditRequest> Requests(int w, int64_t claim, int64_t epoch, double now) {
    ApiResponse r = BeatWith(w, claim, epoch, now, json::array());
    EXPECT_EQ(r.status, 200) << r.body;
    auto requests = ParseAuditRequests(Body(r));
    EXPECT_TRUE(requests.ok()) << requests.status().message();
    return requests.ok() ? *requests : std::vector<AuditRequest>{};
  }

  // Holder w's answer to `req` from its row store, with `tamper` applied to the reveal.
  json Answer(int w, const AuditRequest& req, const ring::Receipt& r,
              const std::function<void(ring::RowReveal*)>& tamper = nullptr) {
    auto reveal = stores_[w]->Reveal(r.id, req.positions);
    EXPECT_TRUE(reveal.ok()) << reveal.status().message();
    if (reveal.ok() && tamper) tamper(&*reveal);
    return json::array({AuditAnswerToJson(req.id, reveal)});
  }

  json BalanceOf(int w, double now) {
    json b = Body(api_->Handle(kvasir::testing::Plain("GET", "/v1/balances"), now));
    for (const json& x : b["balances"]) {
      if (x["node"] == ring::PublicKeyHex(keys_[w].public_key())) return x;
    }
    return json();
  }

  std::shared_ptr<ring::RowStore> stores_[3] = {
      std::make_shared<ring::RowStore>(ring::RowStoreOptions{}),
      std::make_shared<ring::RowStore>(ring::RowStoreOptions{}),
      std::make_shared<ring::RowStore>(ring::RowStoreOptions{})};
};

TEST_F(AuditTest, HonestRevealsPassAndLiesRefusalsAndSilenceForfeit) {
  const auto ids = FillRing(kT0);
  const int64_t epoch = MakeReady(ids, kT0);
  const ring::Receipt r = RunSession(1);
  ASSERT_EQ(Submit(r, kT0 + 10).status, 200);

  std::vector<AuditRequest> asked[3];
  for (int w = 0; w < 3; ++w) {
    asked[w] = Requests(w, ids[w], epoch, kT0 + 11);
    ASSERT_EQ(asked[w].size(), 1u) << "holder " << w;
    EXPECT_EQ(asked[w][0].receipt, ring::ReceiptIdHex(r));
    EXPECT_EQ(asked[w][0].positions.size(), 4u);
    for (uint64_t p : asked[w][0].positions) EXPECT_LT(p, 20u);
    EXPECT_EQ(asked[w][0].positions, asked[0][0].positions) << "both sides of every boundary";
  }
  const double earned = BalanceOf(0, kT0 + 11)["credit"].get<double>();
  EXPECT_GT(earned, 0);

  // Holder 0 reveals what it committed to: passed, and asked nothing more.
  ApiResponse ok = BeatWith(0, ids[0], epoch, kT0 + 12, Answer(0, asked[0][0], r));
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_FALSE(Body(ok).contains("audits"));
  EXPECT_EQ(BalanceOf(0, kT0 + 12)["audits_passed"], 1);
  EXPECT_EQ(BalanceOf(0, kT0 + 12)["credit"].get<double>(), earned);

  // Holder 1 reveals rows other than those it committed to (one byte of one output row).
  ApiResponse lie =
      BeatWith(1, ids[1], epoch, kT0 + 12, Answer(1, asked[1][0], r, [](ring::RowReveal* rev) {
                 rev->positions[0].rows.out.bytes[3] ^= 0x20;
               }));
  EXPECT_EQ(lie.status, 404) << "its claim is evicted: " << lie.body;
  EXPECT_EQ(BalanceOf(1, kT0 + 12)["audits_failed"], 1);
  EXPECT_EQ(BalanceOf(1, kT0 + 12)["credit"].get<double>(), 0.0) << "the session's credit is gone";
  EXPECT_EQ(BalanceOf(1, kT0 + 12)["work"], 0);
  ApiResponse again = Claim(keys_[1], 1, kT0 + 13);
  EXPECT_EQ(again.status, 403);
  EXPECT_NE(Reason(again).find("failed 1 audit(s) of its work: it may claim again in 99 s"),
            std::string::npos)
      << Reason(again);
  EXPECT_EQ(RingJson(kT0 + 13)["windows"][1]["state"], "uncovered");

  // A reveal of other positions than those asked, or of another session, fails as well.
  {
    AuditRequest other = asked[2][0];
    other.positions = {0, 1, 2, 3};
    if (other.positions == asked[2][0].positions) other.positions = {4, 5, 6, 7};
    ApiResponse wrong = BeatWith(2, ids[2], epoch, kT0 + 14, Answer(2, other, r));
    EXPECT_EQ(wrong.status, 404) << wrong.body;
    EXPECT_EQ(BalanceOf(2, kT0 + 14)["audits_failed"], 1);
  }
  // Answering an audit twice changes nothing; answering another node's is refused.
  EXPECT_EQ(BeatWith(0, ids[0], epoch, kT0 + 15, Answer(0, asked[0][0], r)).status, 200);
  EXPECT_EQ(BalanceOf(0, kT0 + 15)["audits_passed"], 1);
  EXPECT_EQ(BeatWith(0, ids[0], epoch, kT0 + 15, Answer(1, asked[1][0], r)).status, 403);
}

// Neighbours that each reveal what they committed to, but whose rows disagree at their shared
// boundary (one took in other rows than the other gave out): one of them lied, and the market
// cannot tell which from the reveals, so both lines' credit is held; the other holder passes.
TEST_F(AuditTest, NeighboursThatDisagreeAtTheirBoundaryAreBothHeld) {
  const auto ids = FillRing(kT0);
  const int64_t epoch = MakeReady(ids, kT0);
  const ring::Receipt r = RunSession(1, 20, /*odd_in=*/2);
  ASSERT_EQ(Submit(r, kT0 + 10).status, 200);
  for (int w : {2, 0, 1}) {
    const std::vector<AuditRequest> asked = Requests(w, ids[w], epoch, kT0 + 11);
    ASSERT_EQ(asked.size(), 1u);
    ApiResponse a = BeatWith(w, ids[w], epoch, kT0 + 12, Answer(w, asked[0], r));
    EXPECT_EQ(a.status, 200) << w << ": " << a.body;
  }
  EXPECT_EQ(BalanceOf(0, kT0 + 12)["audits_passed"], 1);
  EXPECT_GT(BalanceOf(0, kT0 + 12)["credit"].get<double>(), 0);
  for (int w : {1, 2}) {
    const json b = BalanceOf(w, kT0 + 12);
    EXPECT_EQ(b["audits_disputed"], 1) << b.dump();
    EXPECT_EQ(b["audits_passed"], 0) << b.dump();
    EXPECT_EQ(b["credit"].get<double>(), 0.0) << "held: " << b.dump();
  }
  EXPECT_TRUE(RingJson(kT0 + 12)["ready"].get<bool>()) << "nobody is banned for it";
}

TEST_F(AuditTest, SilenceIsARefusalAndEachOffenceBansLonger) {
  double now = kT0;
  std::vector<int64_t> ids = FillRing(now);
  for (int round = 1; round <= 3; ++round) {
    const int64_t epoch = MakeReady(ids, now);
    const ring::Receipt r = RunSession(static_cast<uint32_t>(round));
    ASSERT_EQ(Submit(r, now + 10).status, 200);
    for (int w = 0; w < 3; ++w) {
      const std::vector<AuditRequest> asked = Requests(w, ids[w], epoch, now + 11);
      ASSERT_EQ(asked.size(), 1u);
      if (w == 1 && round == 1) continue;  // holder 1 stays silent
      json answer = Answer(w, asked[0], r);
      if (w == 1) answer = json::array({AuditAnswerToJson(asked[0].id, Error("no rows kept"))});
      ApiResponse a = BeatWith(w, ids[w], epoch, now + 12, answer);
      EXPECT_EQ(a.status, w == 1 ? 404 : 200) << round << " " << w << ": " << a.body;
    }
    if (round == 1) {
      // Past the deadline to reveal, any heartbeat settles it.
      now += 12 + 600 + 1;
      EXPECT_EQ(BeatWith(0, ids[0], epoch, now, json::array()).status, 200);
    } else {
      now += 12;
    }
    EXPECT_EQ(BalanceOf(1, now)["audits_failed"], round);
    const double ban = 100.0 * (1 << (round - 1));
    ApiResponse refused = Claim(keys_[1], 1, now + 1);
    EXPECT_EQ(refused.status, 403) << round;
    EXPECT_NE(Reason(refused).find(fmt::format("failed {} audit(s)", round)), std::string::npos)
        << Reason(refused);
    now += ban + 1;
    // Its window was freed; after its ban, holder 1 may claim it back.
    ApiResponse back = Claim(keys_[1], 1, now);
    ASSERT_EQ(back.status, 201) << round << ": " << back.body;
    ids[1] = Body(back)["claim"].get<int64_t>();
  }
  EXPECT_EQ(BalanceOf(0, now)["audits_passed"], 3);
  EXPECT_EQ(BalanceOf(1, now)["credit"].get<double>(), 0.0);
}

// A disputed pair is settled when the recomputation fails one of them: that one forfeits, and the
// other gets its held credit back (its audit passes again, still to be recomputed itself).
TEST_F(AuditTest, ADisputeSettledByRecomputationGivesTheOtherSideItsCreditBack) {
  const auto ids = FillRing(kT0);
  const int64_t epoch = MakeReady(ids, kT0);
  const ring::Receipt r = RunSession(1, 20, /*odd_in=*/2);
  ASSERT_EQ(Submit(r, kT0 + 10).status, 200);
  const double earned1 = BalanceOf(1, kT0 + 10)["credit"].get<double>();
  ASSERT_GT(earned1, 0);
  for (int w : {2, 0, 1}) {
    const std::vector<AuditRequest> asked = Requests(w, ids[w], epoch, kT0 + 11);
    ASSERT_EQ(asked.size(), 1u);
    ASSERT_EQ(BeatWith(w, ids[w], epoch, kT0 + 12, Answer(w, asked[0], r)).status, 200);
  }
  ASSERT_EQ(BalanceOf(1, kT0 + 12)["audits_disputed"], 1);
  auto jobs = store_->PendingRecomputes("tiny", 10);
  ASSERT_TRUE(jobs.ok()) << jobs.status().message();
  ASSERT_EQ(jobs->size(), 3u);
  const std::string node2 = kvasir::testing::Hex(keys_[2]);
  int64_t audit2 = 0;
  for (const RecomputeJob& j : *jobs) {
    if (j.node == node2) audit2 = j.audit;
  }
  ASSERT_NE(audit2, 0);
  ASSERT_TRUE(store_->RecordRecompute(audit2, "", "row 3 is 0.2 away", kT0 + 13).ok());
  const json b1 = BalanceOf(1, kT0 + 13), b2 = BalanceOf(2, kT0 + 13);
  EXPECT_EQ(b1["audits_disputed"], 0) << b1.dump();
  EXPECT_EQ(b1["audits_passed"], 1) << b1.dump();
  EXPECT_DOUBLE_EQ(b1["credit"].get<double>(), earned1) << "given back: " << b1.dump();
  EXPECT_EQ(b2["audits_failed"], 1) << b2.dump();
  EXPECT_EQ(b2["credit"].get<double>(), 0.0) << b2.dump();
  // Holder 1 is still recomputed; when it fails too, it forfeits what it was given back.
  auto left = store_->PendingRecomputes("tiny", 10);
  ASSERT_TRUE(left.ok()) << left.status().message();
  ASSERT_EQ(left->size(), 2u);
  for (const RecomputeJob& j : *left) {
    if (j.node != kvasir::testing::Hex(keys_[1])) continue;
    ASSERT_TRUE(store_->RecordRecompute(j.audit, "", "row 1 is 0.3 away", kT0 + 14).ok());
  }
  EXPECT_EQ(BalanceOf(1, kT0 + 14)["audits_failed"], 1);
  EXPECT_EQ(BalanceOf(1, kT0 + 14)["credit"].get<double>(), 0.0);
}

// A stored reveal that does not parse fails its own audit and keeps no other from the auditor.
TEST_F(AuditTest, AStoredRevealThatDoesNotParseFailsAloneAndTheOthersGoOn) {
  const auto ids = FillRing(kT0);
  const int64_t epoch = MakeReady(ids, kT0);
  const ring::Receipt r = RunSession(1);
  ASSERT_EQ(Submit(r, kT0 + 10).status, 200);
  for (int w = 0; w < 3; ++w) {
    const std::vector<AuditRequest> asked = Requests(w, ids[w], epoch, kT0 + 11);
    ASSERT_EQ(asked.size(), 1u);
    ASSERT_EQ(BeatWith(w, ids[w], epoch, kT0 + 12, Answer(w, asked[0], r)).status, 200);
  }
  {
    auto db = Db::Open(db_);
    ASSERT_TRUE(db.ok()) << db.status().message();
    auto s = (*db)->Prepare("UPDATE audits SET revealed = ? WHERE node = ?");
    ASSERT_TRUE(s.ok()) << s.status().message();
    ASSERT_TRUE(s->Bind(1, std::string_view("{\"audit\": 1, \"n\": "))
                    .Bind(2, kvasir::testing::Hex(keys_[1]))
                    .Run()
                    .ok());
  }
  for (int round = 0; round < 2; ++round) {
    auto jobs = store_->PendingRecomputes("tiny", 10);
    ASSERT_TRUE(jobs.ok()) << jobs.status().message();
    ASSERT_EQ(jobs->size(), 2u) << round;
    for (const RecomputeJob& j : *jobs) EXPECT_NE(j.node, kvasir::testing::Hex(keys_[1]));
  }
  const json b1 = BalanceOf(1, kT0 + 13);
  EXPECT_EQ(b1["audits_failed"], 1) << b1.dump();
  EXPECT_EQ(b1["credit"].get<double>(), 0.0) << b1.dump();
  EXPECT_EQ(BalanceOf(0, kT0 + 13)["audits_passed"], 1);
}

}  // namespace
}  // namespace kvasir::market
