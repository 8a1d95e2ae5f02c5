// The market's API as a function (no sockets): claims as leases, neighbours, rewards, signatures,
// replays, malformed input, receipts and balances, and durability across a reopened database.
#include "market/api.h"

#include <gtest/gtest.h>

#include "market/map_json.h"
#include "market_fixture.h"
#include "market_test_util.h"
#include "relay/edge_token.h"
#include "test_assets.h"

namespace kvasir::market {
namespace {

using kvasir::testing::Body;
using kvasir::testing::Hex;
using kvasir::testing::KeyN;
using kvasir::testing::Plain;
using kvasir::testing::Signed;
using nlohmann::json;

using MarketApiTest = MarketFixture;

TEST_F(MarketApiTest, AClaimGrantsTheWindowAndItsDigests) {
  ApiResponse r = Claim(keys_[0], 1, kT0);
  ASSERT_EQ(r.status, 201) << r.body;
  json j = Body(r);
  EXPECT_EQ(j["first"], 2);
  EXPECT_EQ(j["last"], 4);
  EXPECT_EQ(j["url"], "http://files.invalid/tiny.gguf");
  EXPECT_EQ(j["model_id"], "0123456789abcdef0123456789abcdef");
  ASSERT_EQ(j["tensors"].size(), 1u);
  EXPECT_EQ(j["tensors"][0]["sha256"], std::string(64, 'b'));
  json w = Map(kT0)["models"][0]["rings"][0]["windows"][1];
  EXPECT_EQ(w["state"], "claimed");
  EXPECT_EQ(w["holder"], Hex(keys_[0]));
  // The empty host was completed with the address the request came from.
  EXPECT_EQ(w["address"], "10.0.0.7:7001");
}

TEST_F(MarketApiTest, AHeldWindowIsAConflictAndOneNodeHoldsOneClaim) {
  ASSERT_EQ(Claim(keys_[0], 0, kT0).status, 201);
  ApiResponse lost = Claim(keys_[1], 0, kT0);
  EXPECT_EQ(lost.status, 409);
  EXPECT_EQ(Body(lost)["error"]["code"], "conflict");
  EXPECT_NE(Body(lost)["error"]["message"].get<std::string>().find("held by node"),
            std::string::npos);
  EXPECT_EQ(Claim(keys_[0], 1, kT0).status, 409);  // already holds window 0
  EXPECT_EQ(Claim(keys_[0], 0, kT0 + 1).status, 200);  // renewing its own
}

TEST_F(MarketApiTest, ACompleteRingNamesNeighboursAndBecomesReadyWhenAllServe) {
  const auto ids = FillRing(kT0);
  json b = Body(Beat(keys_[0], ids[0], -1, kT0 + 1));
  ASSERT_TRUE(b["complete"].get<bool>()) << b;
  EXPECT_FALSE(b["ready"].get<bool>());
  EXPECT_EQ(b["pred"]["window"], 2);
  EXPECT_EQ(b["pred"]["node"], Hex(keys_[2]));
  EXPECT_EQ(b["next"]["window"], 1);
  EXPECT_EQ(b["next"]["address"], "10.0.0.7:7001");
  EXPECT_FALSE(b["next"].contains("via"));
  EXPECT_EQ(api_->Handle(Plain("GET", "/v1/rings/tiny"), kT0 + 1).status, 503);
  const int64_t epoch = b["epoch"].get<int64_t>();
  for (int w = 0; w < 3; ++w) ASSERT_EQ(Beat(keys_[w], ids[w], epoch, kT0 + 2).status, 200);
  // Every holder says it serves, but the market has not dialed them yet: not ready.
  EXPECT_TRUE(RingJson(kT0 + 2)["serving"].get<bool>());
  EXPECT_FALSE(RingJson(kT0 + 2)["ready"].get<bool>());
  ApiResponse unchecked = api_->Handle(Plain("GET", "/v1/rings/tiny"), kT0 + 2);
  EXPECT_EQ(unchecked.status, 503);
  EXPECT_NE(Reason(unchecked).find("waiting for the market's check"), std::string::npos)
      << unchecked.body;
  // The last heartbeat asked for a check of each holder: the head's with its model and window.
  ASSERT_EQ(checks_.jobs.size(), 3u);
  EXPECT_TRUE(checks_.jobs[0].head);
  EXPECT_EQ(checks_.jobs[0].node, Hex(keys_[0]));
  EXPECT_EQ(checks_.jobs[0].address, "10.0.0.7:7001");
  EXPECT_EQ(checks_.jobs[0].model_id, "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(checks_.jobs[0].last, 2);
  EXPECT_EQ(checks_.jobs[0].epoch, epoch);
  EXPECT_FALSE(checks_.jobs[1].head);
  checks_.Answer(store_.get(), kT0 + 2);
  ApiResponse ring = api_->Handle(Plain("GET", "/v1/rings/tiny"), kT0 + 2);
  ASSERT_EQ(ring.status, 200) << ring.body;
  EXPECT_EQ(Body(ring)["head"]["node"], Hex(keys_[0]));
  (void)api_->Handle(Plain("GET", "/v1/rings/tiny"), kT0 + 3);
  // Two requests from one address within 10 s count as one of demand.
  EXPECT_EQ(Map(kT0 + 3)["models"][0]["demand"]["total"], 1);
  EXPECT_EQ(RingJson(kT0 + 3)["windows"][1]["state"], "serving");
  EXPECT_EQ(RingJson(kT0 + 3)["windows"][1]["checked"], true);
  // A new epoch (a holder leaves and another comes) needs new checks.
  ASSERT_EQ(api_->Handle(Signed(keys_[1], "DELETE", "/v1/claims/" + std::to_string(ids[1]), "",
                                kT0 + 4),
                         kT0 + 4)
                .status,
            200);
  const int64_t replaced = Body(Claim(keys_[3], 1, kT0 + 4))["claim"].get<int64_t>();
  const int64_t next = RingJson(kT0 + 4)["epoch"].get<int64_t>();
  ASSERT_GT(next, epoch);
  for (auto [k, id] : {std::pair{0, ids[0]}, std::pair{3, replaced}, std::pair{2, ids[2]}}) {
    ASSERT_EQ(Beat(keys_[k], id, next, kT0 + 5).status, 200);
  }
  EXPECT_FALSE(RingJson(kT0 + 5)["ready"].get<bool>());
  EXPECT_EQ(RingJson(kT0 + 5)["windows"][0]["checked"], false);
  checks_.Answer(store_.get(), kT0 + 5);
  EXPECT_TRUE(RingJson(kT0 + 5)["ready"].get<bool>());
}

TEST_F(MarketApiTest, ALeaseThatIsNotRenewedFreesTheWindowAndChangesTheEpoch) {
  const auto ids = FillRing(kT0);
  const int64_t epoch = Map(kT0)["models"][0]["rings"][0]["epoch"].get<int64_t>();
  ASSERT_EQ(Beat(keys_[0], ids[0], -1, kT0 + 20).status, 200);
  ASSERT_EQ(Beat(keys_[2], ids[2], -1, kT0 + 20).status, 200);
  // Window 1 stopped heartbeating at kT0: its 30 s lease is over at kT0 + 30.
  EXPECT_EQ(Map(kT0 + 16)["models"][0]["rings"][0]["windows"][1]["state"], "expiring");
  json ring = Map(kT0 + 31)["models"][0]["rings"][0];
  EXPECT_EQ(ring["windows"][1]["state"], "uncovered");
  EXPECT_FALSE(ring["complete"].get<bool>());
  EXPECT_GT(ring["epoch"].get<int64_t>(), epoch);
  ApiResponse gone = Beat(keys_[1], ids[1], -1, kT0 + 31);
  EXPECT_EQ(gone.status, 404);
  // The neighbours learn it, and a new node takes the window.
  EXPECT_TRUE(Body(Beat(keys_[0], ids[0], -1, kT0 + 32))["next"].is_null());
  ASSERT_EQ(Claim(keys_[3], 1, kT0 + 33).status, 201);
  EXPECT_EQ(Body(Beat(keys_[0], ids[0], -1, kT0 + 34))["next"]["node"], Hex(keys_[3]));
}

TEST_F(MarketApiTest, OnlyTheHolderReleasesOrRenewsAClaim) {
  const int64_t id = Body(Claim(keys_[0], 0, kT0))["claim"].get<int64_t>();
  const std::string target = "/v1/claims/" + std::to_string(id);
  EXPECT_EQ(api_->Handle(Signed(keys_[1], "DELETE", target, "", kT0), kT0).status, 403);
  EXPECT_EQ(Beat(keys_[1], id, -1, kT0).status, 403);
  EXPECT_EQ(api_->Handle(Signed(keys_[0], "DELETE", target, "", kT0), kT0).status, 200);
  EXPECT_EQ(Map(kT0)["models"][0]["rings"][0]["windows"][0]["state"], "uncovered");
  EXPECT_EQ(api_->Handle(Signed(keys_[0], "DELETE", target, "", kT0), kT0).status, 404);
  EXPECT_EQ(api_->Handle(Signed(keys_[0], "DELETE", "/v1/claims/x1", "", kT0), kT0).status, 400);
}

TEST_F(MarketApiTest, UnsignedForgedStaleAndReplayedRequestsAreRefused) {
  const std::string body = R"({"model":"tiny","ring":0,"window":0,"address":":7001"})";
  ApiResponse unsigned_req = api_->Handle(Plain("POST", "/v1/claims", body), kT0);
  EXPECT_EQ(unsigned_req.status, 401);
  EXPECT_NE(unsigned_req.body.find("X-Kvasir-Node: missing"), std::string::npos);

  ApiRequest tampered = Signed(keys_[0], "POST", "/v1/claims", body, kT0);
  tampered.body = R"({"model":"tiny","ring":0,"window":1,"address":":7001"})";
  ApiResponse t = api_->Handle(tampered, kT0);
  EXPECT_EQ(t.status, 401);
  EXPECT_NE(t.body.find("does not verify"), std::string::npos);

  ApiRequest other_target = Signed(keys_[0], "POST", "/v1/heartbeat", body, kT0);
  other_target.target = "/v1/claims";
  EXPECT_EQ(api_->Handle(other_target, kT0).status, 401);

  ApiRequest impostor = Signed(keys_[0], "POST", "/v1/claims", body, kT0);
  impostor.headers["x-kvasir-node"] = Hex(keys_[1]);
  EXPECT_EQ(api_->Handle(impostor, kT0).status, 401);

  ApiResponse stale = api_->Handle(Signed(keys_[0], "POST", "/v1/claims", body, kT0 - 500), kT0);
  EXPECT_EQ(stale.status, 401);
  EXPECT_NE(stale.body.find("away from the market's clock"), std::string::npos);

  ApiRequest once = Signed(keys_[0], "POST", "/v1/claims", body, kT0);
  EXPECT_EQ(api_->Handle(once, kT0).status, 201);
  ApiResponse replay = api_->Handle(once, kT0 + 1);
  EXPECT_EQ(replay.status, 401);
  EXPECT_NE(replay.body.find("replayed"), std::string::npos);

  ApiRequest bad_hex = Signed(keys_[0], "POST", "/v1/claims", body, kT0);
  bad_hex.headers["x-kvasir-signature"] = "zz";
  EXPECT_EQ(api_->Handle(bad_hex, kT0).status, 401);
}

TEST_F(MarketApiTest, AReplayIsCaughtAfterTheDatabaseIsReopened) {
  const std::string body = R"({"model":"tiny","ring":0,"window":0,"address":":7001"})";
  ApiRequest once = Signed(keys_[0], "POST", "/v1/claims", body, kT0);
  ASSERT_EQ(api_->Handle(once, kT0).status, 201);
  api_.reset();
  store_.reset();
  auto s = Store::Open(db_);
  ASSERT_TRUE(s.ok());
  store_ = std::move(s).value();
  MakeApi({});
  ApiRequest release = Signed(keys_[0], "DELETE", "/v1/claims/1", "", kT0);
  ASSERT_EQ(api_->Handle(release, kT0 + 1).status, 200);
  EXPECT_EQ(api_->Handle(once, kT0 + 2).status, 401);  // the nonce is remembered
}

TEST_F(MarketApiTest, MalformedRequestsNameWhatIsWrong) {
  auto claim_with = [&](const std::string& body) {
    return api_->Handle(Signed(keys_[0], "POST", "/v1/claims", body, kT0), kT0);
  };
  auto message = [](const ApiResponse& r) {
    json j = Body(r);
    return j.is_discarded() ? std::string("(not JSON)") : j["error"]["message"].get<std::string>();
  };
  EXPECT_EQ(claim_with("{not json").status, 400);
  EXPECT_EQ(message(claim_with("[1,2]")), "body: must be a JSON object");
  EXPECT_EQ(message(claim_with(R"({"ring":0,"window":0,"address":":1"})")),
            "field 'model': missing");
  EXPECT_EQ(message(claim_with(R"({"model":"tiny","ring":"0","window":0,"address":":1"})")),
            "field 'ring': must be an integer");
  EXPECT_EQ(message(claim_with(R"({"model":"t!ny","ring":0,"window":0,"address":":1"})")),
            "field 'model': 1-64 characters from A-Z a-z 0-9 . _ -");
  EXPECT_EQ(message(claim_with(R"({"model":"tiny","ring":0,"window":-1,"address":":1"})")),
            "field 'window': must be from 0 to 1048576, not -1");
  EXPECT_EQ(claim_with(R"({"model":"tiny","ring":0,"window":9,"address":":1"})").status, 404);
  EXPECT_EQ(claim_with(R"({"model":"nope","ring":0,"window":0,"address":":1"})").status, 404);
  EXPECT_EQ(claim_with(R"({"model":"tiny","ring":0,"window":1})").status, 400);
  EXPECT_EQ(claim_with(R"({"model":"tiny","ring":0,"window":1,"address":"h:0"})").status, 400);
  EXPECT_EQ(claim_with(R"({"model":"tiny","ring":0,"window":1,"address":")" +
                       std::string(300, 'a') + R"(:1"})")
                .status,
            400);
  EXPECT_NE(message(claim_with(R"({"model":"tiny","ring":0,"window":1,"behind_nat":true})"))
                .find("no relay"),
            std::string::npos);
  EXPECT_EQ(message(claim_with(std::string(100, '[') + std::string(100, ']'))),
            "body: JSON nested deeper than 16");
  ApiRequest huge = Signed(keys_[0], "POST", "/v1/claims", std::string(kMaxRequestBytes + 1, ' '),
                           kT0);
  EXPECT_EQ(api_->Handle(huge, kT0).status, 413);
  EXPECT_EQ(api_->Handle(Plain("GET", "/v1/nothing"), kT0).status, 404);
  ApiResponse wrong_method = api_->Handle(Plain("GET", "/v1/claims"), kT0);
  EXPECT_EQ(wrong_method.status, 405);
  EXPECT_EQ(wrong_method.allow, "POST");
  EXPECT_EQ(api_->Handle(Plain("GET", "/v1/rings/../../x"), kT0).status, 400);
  EXPECT_EQ(api_->Handle(Plain("GET", "/v1/balances?node=xyz"), kT0).status, 400);
}

TEST_F(MarketApiTest, RewardsFavourScarceModels) {
  // All of the model uncovered: u = 1, no demand: rate 2, a 2-layer window shows 4.
  json w = Map(kT0)["models"][0]["rings"][0]["windows"][0];
  EXPECT_DOUBLE_EQ(w["rate"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(w["reward"].get<double>(), 4.0);
  // The first claimer locks 2; the next uncovered windows now pay (1 + 2/3).
  ASSERT_EQ(Claim(keys_[0], 0, kT0).status, 201);
  EXPECT_DOUBLE_EQ(Map(kT0)["models"][0]["rings"][0]["windows"][1]["rate"].get<double>(), 1.667);
  EXPECT_DOUBLE_EQ(Map(kT0)["models"][0]["rings"][0]["windows"][0]["rate"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(RewardRate(20, 0, 3), 3.0);
  EXPECT_DOUBLE_EQ(RewardRate(1000, 0, 3), 5.0);  // demand is capped at d = 4
}

TEST_F(MarketApiTest, NodesBehindNatGetRelayEdgesWithTheirOwnTokens) {
  const std::string secret = "0123456789abcdef-relay-secret";
  MakeApi({30, 120, "wss://relay.test:8443", secret, {}, {}});
  const auto a = Body(Claim(keys_[0], 0, kT0))["claim"].get<int64_t>();
  EXPECT_EQ(Claim(keys_[1], 0, kT0, {{"behind_nat", true}}).status, 400);  // the head needs an address
  const auto b = Body(Claim(keys_[1], 1, kT0, {{"behind_nat", true}}))["claim"].get<int64_t>();
  const auto c = Body(Claim(keys_[2], 2, kT0))["claim"].get<int64_t>();
  json head = Body(Beat(keys_[0], a, -1, kT0));
  // Head -> window 1 crosses the NAT: relayed; window 2 -> head is direct.
  const std::string edge = EdgeIdFor(a, b);
  EXPECT_EQ(head["next"]["via"], "wss://relay.test:8443/edge/" + edge);
  const auto key = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(secret.data()),
                                            secret.size());
  const relay::EdgeToken mine = relay::MakeEdgeToken(key, edge, relay::Role::kPredecessorSide);
  EXPECT_EQ(head["next"]["token"],
            ToHex(std::string_view(reinterpret_cast<const char*>(mine.data()), mine.size())));
  EXPECT_FALSE(head["pred"].contains("via"));
  json nat = Body(Beat(keys_[1], b, -1, kT0));
  EXPECT_EQ(nat["pred"]["via"], "wss://relay.test:8443/edge/" + edge);
  const relay::EdgeToken theirs = relay::MakeEdgeToken(key, edge, relay::Role::kSuccessorSide);
  EXPECT_EQ(nat["pred"]["token"],
            ToHex(std::string_view(reinterpret_cast<const char*>(theirs.data()), theirs.size())));
  EXPECT_EQ(nat["next"]["via"], "wss://relay.test:8443/edge/" + EdgeIdFor(b, c));
  EXPECT_EQ(Map(kT0)["models"][0]["rings"][0]["windows"][1]["address"], "");
}

class MarketReceiptTest : public MarketApiTest {
 protected:
  void SetUp() override {
    MarketApiTest::SetUp();
    ids_ = FillRing(kT0);
    MakeReady(ids_, kT0);
  }
  ApiResponse Submit(const ring::Receipt& r, double now = kT0 + 1) {
    return MarketApiTest::Submit(r, now);
  }
  std::vector<int64_t> ids_;
};

TEST_F(MarketReceiptTest, AReceiptOfTheRingCreditsEveryHolder) {
  ring::Receipt r = kvasir::testing::SignedReceipt({&keys_[0], &keys_[1], &keys_[2]}, 20);
  ApiResponse ok = Submit(r);
  ASSERT_EQ(ok.status, 200) << ok.body;
  // Each window: 20 tokens x 2 layers, at the rate locked when claimed (2, 1.667, 1.333).
  json credited = Body(ok)["credited"];
  ASSERT_EQ(credited.size(), 3u);
  EXPECT_EQ(credited[0]["work"], 40);
  EXPECT_DOUBLE_EQ(credited[0]["credit"].get<double>(), 80.0);
  EXPECT_DOUBLE_EQ(credited[1]["credit"].get<double>(), 40 * 1.667);
  json balances = Body(api_->Handle(Plain("GET", "/v1/balances"), kT0 + 2));
  ASSERT_EQ(balances["balances"].size(), 3u);
  EXPECT_EQ(balances["balances"][0]["node"], Hex(keys_[0]));
  EXPECT_EQ(balances["receipts"][0]["tokens"], 20);
  EXPECT_EQ(balances["receipts"][0]["lines"].size(), 3u);
  json mine = Body(api_->Handle(Plain("GET", "/v1/balances?node=" + Hex(keys_[1])), kT0 + 2));
  EXPECT_EQ(mine["receipts"].size(), 1u);
}

TEST_F(MarketReceiptTest, DuplicatedForgedTruncatedAndForeignReceiptsAreRefused) {
  ring::Receipt good = kvasir::testing::SignedReceipt({&keys_[0], &keys_[1], &keys_[2]}, 20);
  ASSERT_EQ(Submit(good).status, 200);
  ApiResponse dup = Submit(good);
  EXPECT_EQ(dup.status, 422);
  EXPECT_NE(Reason(dup).find("duplicate receipt"), std::string::npos);

  // The head inflates the tokens of the others' lines: their signatures no longer hold.
  ring::Receipt forged = kvasir::testing::SignedReceipt({&keys_[0], &keys_[1], &keys_[2]}, 20, 2);
  forged.lines[1].tokens = 2000;
  EXPECT_EQ(Submit(forged).status, 422);

  // Everything in order but one signature: caught by the signature check, the last one.
  ring::Receipt bad_sig = kvasir::testing::SignedReceipt({&keys_[0], &keys_[1], &keys_[2]}, 20, 8);
  bad_sig.lines[2].signature[10] ^= 1;
  ApiResponse bs = Submit(bad_sig);
  EXPECT_EQ(bs.status, 422);
  EXPECT_NE(Reason(bs).find("does not verify"), std::string::npos) << Reason(bs);

  ring::Receipt truncated = kvasir::testing::SignedReceipt({&keys_[0], &keys_[1]}, 20, 3);
  ApiResponse t = Submit(truncated);
  EXPECT_EQ(t.status, 422);
  EXPECT_NE(Reason(t).find("truncated"), std::string::npos);

  // A stranger signs a line for a window it does not hold.
  ring::Receipt stranger = kvasir::testing::SignedReceipt({&keys_[0], &keys_[3], &keys_[2]}, 20, 4);
  ApiResponse s = Submit(stranger);
  EXPECT_EQ(s.status, 422);
  EXPECT_NE(Reason(s).find("does not hold window 1"), std::string::npos);

  // A stage claiming more work than the others: the lines must agree.
  ring::Receipt greedy;
  greedy.id.fill(5);
  greedy.model_id = good.model_id;
  greedy.session = 7;
  ring::AppendReceiptLine(&greedy, keys_[0], 0, 2, 20, ring::Digest{});
  ring::AppendReceiptLine(&greedy, keys_[1], 2, 4, 99, ring::Digest{});
  ring::AppendReceiptLine(&greedy, keys_[2], 4, 6, 20, ring::Digest{});
  ApiResponse g = Submit(greedy);
  EXPECT_EQ(g.status, 422);
  EXPECT_NE(Reason(g).find("must agree"), std::string::npos);

  // Windows that do not tile the model.
  ring::Receipt gap;
  gap.id.fill(6);
  gap.model_id = good.model_id;
  gap.session = 7;
  ring::AppendReceiptLine(&gap, keys_[0], 0, 2, 20, ring::Digest{});
  ring::AppendReceiptLine(&gap, keys_[1], 3, 4, 20, ring::Digest{});
  ring::AppendReceiptLine(&gap, keys_[2], 4, 6, 20, ring::Digest{});
  EXPECT_EQ(Submit(gap).status, 422);

  ring::Receipt other_model =
      kvasir::testing::SignedReceipt({&keys_[0], &keys_[1], &keys_[2]}, 20, 7, std::string(32, 'f'));
  ApiResponse om = Submit(other_model);
  EXPECT_EQ(om.status, 422);
  EXPECT_NE(Reason(om).find("no registered model"), std::string::npos);

  // A version 1 receipt (from stages that predate row commitments): the version field, at
  // offset 40, was reserved and zero.
  std::vector<uint8_t> v1 = ring::EncodeReceipt(
      kvasir::testing::SignedReceipt({&keys_[0], &keys_[1], &keys_[2]}, 20, 8));
  v1[40] = 0;
  std::string v1_hex;
  for (uint8_t b : v1) v1_hex += fmt::format("{:02x}", b);
  ApiResponse old = api_->Handle(
      Plain("POST", "/v1/receipts", fmt::format(R"({{"receipt":"{}"}})", v1_hex)), kT0);
  EXPECT_EQ(old.status, 422);
  EXPECT_NE(Reason(old).find("a version 1 receipt, without row commitments"), std::string::npos)
      << Reason(old);

  // The largest receipt is read (and refused for what it says, not for its length).
  ring::Receipt full;
  full.id.fill(9);
  full.model_id = good.model_id;
  full.session = 7;
  for (uint32_t i = 0; i < wire::kMaxReceiptLines; ++i) {
    ring::AppendReceiptLine(&full, keys_[0], i, i + 1, 20, ring::Digest{});
  }
  EXPECT_EQ(Submit(full).status, 422);

  EXPECT_EQ(api_->Handle(Plain("POST", "/v1/receipts", R"({"receipt":"0g"})"), kT0).status, 400);
  EXPECT_EQ(api_->Handle(Plain("POST", "/v1/receipts", R"({"receipt":"00"})"), kT0).status, 422);
  // Nothing but the first receipt was credited.
  json balances = Body(api_->Handle(Plain("GET", "/v1/balances"), kT0 + 2));
  EXPECT_EQ(balances["receipts"].size(), 1u);
  EXPECT_EQ(balances["balances"][0]["receipts"], 1);
}

TEST_F(MarketReceiptTest, ClaimsReceiptsAndBalancesSurviveAReopenedDatabase) {
  ASSERT_EQ(Submit(kvasir::testing::SignedReceipt({&keys_[0], &keys_[1], &keys_[2]}, 9)).status,
            200);
  api_.reset();
  store_.reset();
  auto s = Store::Open(db_);
  ASSERT_TRUE(s.ok());
  store_ = std::move(s).value();
  MakeApi({});
  json ring = Map(kT0 + 2)["models"][0]["rings"][0];
  EXPECT_TRUE(ring["ready"].get<bool>());
  EXPECT_TRUE(ring["complete"].get<bool>());
  EXPECT_EQ(ring["windows"][2]["holder"], Hex(keys_[2]));
  json balances = Body(api_->Handle(Plain("GET", "/v1/balances"), kT0 + 2));
  EXPECT_EQ(balances["balances"].size(), 3u);
  EXPECT_EQ(balances["receipts"][0]["tokens"], 9);
}

TEST_F(MarketApiTest, ThePageAndHealthAreServed) {
  ApiResponse page = api_->Handle(Plain("GET", "/"), kT0);
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_NE(page.body.find("<html"), std::string::npos);
  json h = Body(api_->Handle(Plain("GET", "/health"), kT0));
  EXPECT_EQ(h["ok"], true);
  EXPECT_EQ(h["models"], 1);
}

}  // namespace
}  // namespace kvasir::market
