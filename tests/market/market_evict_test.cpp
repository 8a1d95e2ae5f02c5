// Claims must serve (docs/MARKET.md, "Claims must serve"): a claim of a complete ring that does
// not serve within its deadline is evicted, an evicted key cools down (longer each time, forgotten
// once it serves), and a holder proves that it holds its window's bytes by answering a challenge
// of ranges under a fresh nonce; wrong bytes evict it at once.
#include <gtest/gtest.h>

#include "market_fixture.h"
#include "market_test_util.h"

namespace kvasir::market {
namespace {

using kvasir::testing::Body;
using kvasir::testing::Signed;
using nlohmann::json;

// TestModel with 8 samples of 16 known bytes per window: sample i of window w is the bytes
// 'A' + w + i, at offset 16 i of the window's tensor.
ModelSpec ModelWithSamples() {
  ModelSpec m = kvasir::testing::TestModel();
  for (auto& ring : m.rings) {
    for (size_t w = 0; w < ring.size(); ++w) {
      for (int i = 0; i < 8; ++i) {
        RangeSample s;
        s.range = {ring[w].tensors[0].name, uint64_t(16 * i), 16};
        s.bytes = std::string(16, static_cast<char>('A' + w + i));
        ring[w].samples.push_back(s);
      }
    }
  }
  return m;
}

class EvictTest : public MarketFixture {
 protected:
  void SetUp() override {}  // each test opens its market with Policy()
  // Deadlines of 10 s (+ the window's bytes at 100 bytes/s when `download`), cool-downs from 30 s.
  void Policy(bool download = false, const ModelSpec& model = kvasir::testing::TestModel()) {
    MarketConfig c;
    c.lease_s = 300;  // leases are not what these tests are about
    c.eviction.deadline_s = 10;
    c.eviction.floor_bytes_per_s = download ? 100 : 1e15;
    c.eviction.cooldown_s = 30;
    Open(model, c);
  }
  std::string State(double now, int window) {
    return RingJson(now)["windows"][static_cast<size_t>(window)]["state"].get<std::string>();
  }
  ApiResponse Prove(const ring::NodeKey& k, int64_t claim, int64_t epoch, double now,
                    const json& proof) {
    json body = {{"claim", claim}, {"serving_epoch", epoch}, {"proof", proof}};
    return api_->Handle(Signed(k, "POST", "/v1/heartbeat", body.dump(), now), now);
  }
  // The right answer to the challenge of `beat` (a heartbeat reply), for window `w`.
  static json Answer(const json& beat, int w, bool wrong = false) {
    const std::string nonce_hex = beat["challenge"]["nonce"].get<std::string>();
    const std::string nonce = FromHex(nonce_hex).value();
    json digests = json::array();
    for (const auto& r : beat["challenge"]["ranges"]) {
      const int i = static_cast<int>(r["offset"].get<uint64_t>() / 16);
      std::string bytes(16, static_cast<char>('A' + w + i));
      if (wrong) bytes[3] ^= 1;
      digests.push_back(ProofDigest(nonce, bytes));
    }
    return {{"nonce", nonce_hex}, {"digests", digests}};
  }
};

TEST_F(EvictTest, AClaimThatDoesNotServeWithinTheDeadlineIsEvicted) {
  Policy();
  const auto ids = FillRing(kT0);
  const int64_t epoch = RingJson(kT0)["epoch"].get<int64_t>();
  EXPECT_EQ(Beat(keys_[0], ids[0], epoch, kT0 + 5).status, 200);
  EXPECT_EQ(Beat(keys_[1], ids[1], epoch, kT0 + 5).status, 200);
  EXPECT_EQ(Beat(keys_[2], ids[2], -1, kT0 + 5).status, 200);
  EXPECT_EQ(State(kT0 + 9.5, 2), "claimed");  // within the deadline
  EXPECT_EQ(State(kT0 + 10.5, 2), "uncovered") << Map(kT0 + 10.5);
  EXPECT_EQ(State(kT0 + 10.5, 0), "claimed");  // the ring's epoch changed; they are not evicted
  EXPECT_EQ(Beat(keys_[2], ids[2], -1, kT0 + 11).status, 404);
}

TEST_F(EvictTest, AnIncompleteRingEvictsNobody) {
  Policy();
  ASSERT_EQ(Claim(keys_[0], 0, kT0).status, 201);
  ASSERT_EQ(Claim(keys_[1], 1, kT0).status, 201);
  EXPECT_EQ(State(kT0 + 25, 0), "claimed");
  EXPECT_EQ(State(kT0 + 25, 1), "claimed");
}

TEST_F(EvictTest, TheDeadlineGrowsWithTheWindowsDownloadTime) {
  // Windows of 1000, 2000, 3000 bytes at 100 bytes/s: +10, +20, +30 s to prove their bytes.
  Policy(/*download=*/true, ModelWithSamples());
  FillRing(kT0);
  EXPECT_EQ(State(kT0 + 21, 0), "uncovered");
  EXPECT_EQ(State(kT0 + 21, 1), "claimed");
  EXPECT_EQ(State(kT0 + 31, 1), "uncovered");
  EXPECT_EQ(State(kT0 + 31, 2), "claimed");
  EXPECT_EQ(State(kT0 + 41, 2), "uncovered");
}

TEST_F(EvictTest, AnEvictedKeyWaitsLongerEachTimeAndIsForgivenOnceItServes) {
  Policy();
  FillRing(kT0);
  double t = kT0 + 11;  // all three evicted: cool-down 30 s
  EXPECT_EQ(State(t, 2), "uncovered");
  ApiResponse r = Claim(keys_[2], 2, t);
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(Reason(r).find("evicted 1 time(s) for not serving its claims: it may claim again in 30 s"),
            std::string::npos)
      << Reason(r);
  EXPECT_EQ(Claim(keys_[2], 2, t + 29).status, 403);
  // Again, and not serving: evicted a second time, now 60 s.
  t += 30;
  for (int w = 0; w < 3; ++w) ASSERT_EQ(Claim(keys_[w], w, t).status, 201) << w;
  t += 11;
  EXPECT_EQ(State(t, 2), "uncovered");
  r = Claim(keys_[2], 2, t + 31);
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(Reason(r).find("evicted 2 time(s)"), std::string::npos) << Reason(r);
  // The cool-down survives a restart of the market.
  Reopen({300, 120, "", "", {10, 1e15, 30}, {}});
  EXPECT_EQ(Claim(keys_[2], 2, t + 59).status, 403);
  t += 60;
  std::vector<int64_t> ids;
  for (int w = 0; w < 3; ++w) {
    ApiResponse c = Claim(keys_[w], w, t);
    ASSERT_EQ(c.status, 201) << c.body;
    ids.push_back(Body(c)["claim"].get<int64_t>());
  }
  MakeReady(ids, t + 1);
  // Serving forgave key 2: a later eviction cools it down 30 s again, not 120.
  ASSERT_EQ(api_->Handle(Signed(keys_[2], "DELETE", fmt::format("/v1/claims/{}", ids[2]), "",
                                t + 2),
                         t + 2)
                .status,
            200);
  ASSERT_EQ(Claim(keys_[6], 2, t + 2).status, 201);  // a new holder: a new deadline
  EXPECT_EQ(Beat(keys_[0], ids[0], -1, t + 3).status, 200);
  t += 2 + 11;
  EXPECT_EQ(State(t, 0), "uncovered");
  r = Claim(keys_[0], 0, t);
  EXPECT_NE(Reason(r).find("evicted 1 time(s)"), std::string::npos) << Reason(r);
}

TEST_F(EvictTest, AHolderProvesItsBytesBeforeItCountsAsServing) {
  Policy(false, ModelWithSamples());
  const auto ids = FillRing(kT0);
  const int64_t epoch = RingJson(kT0)["epoch"].get<int64_t>();
  std::vector<json> beats;
  for (int w = 0; w < 3; ++w) {
    ApiResponse b = Beat(keys_[w], ids[w], epoch, kT0 + 1);
    ASSERT_EQ(b.status, 200);
    beats.push_back(Body(b));
    ASSERT_TRUE(beats[w].contains("challenge")) << b.body;
    EXPECT_EQ(beats[w]["challenge"]["ranges"].size(), size_t(kRangesPerChallenge));
    EXPECT_EQ(beats[w]["challenge"]["ranges"][0]["length"], 16);
  }
  // Every holder says it serves, but none has proved its bytes.
  EXPECT_FALSE(RingJson(kT0 + 1)["serving"].get<bool>());
  EXPECT_FALSE(RingJson(kT0 + 1)["windows"][0]["proven"].get<bool>());
  // Each challenge has a nonce of its own.
  EXPECT_NE(beats[0]["challenge"]["nonce"], beats[1]["challenge"]["nonce"]);
  for (int w = 0; w < 3; ++w) {
    ApiResponse b = Prove(keys_[w], ids[w], epoch, kT0 + 2, Answer(beats[w], w));
    ASSERT_EQ(b.status, 200) << b.body;
    EXPECT_FALSE(Body(b).contains("challenge"));
  }
  EXPECT_TRUE(RingJson(kT0 + 2)["serving"].get<bool>());
  EXPECT_TRUE(RingJson(kT0 + 2)["windows"][2]["proven"].get<bool>());
}

TEST_F(EvictTest, AHolderThatAnswersWithWrongBytesIsRefusedAndEvicted) {
  Policy(false, ModelWithSamples());
  const auto ids = FillRing(kT0);
  const json beat = Body(Beat(keys_[1], ids[1], -1, kT0 + 1));
  ApiResponse r = Prove(keys_[1], ids[1], -1, kT0 + 2, Answer(beat, 1, /*wrong=*/true));
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_NE(Reason(r).find("does not match the model's"), std::string::npos) << Reason(r);
  EXPECT_NE(Reason(r).find("the claim is evicted"), std::string::npos) << Reason(r);
  EXPECT_EQ(State(kT0 + 2, 1), "uncovered");
  EXPECT_EQ(Claim(keys_[1], 1, kT0 + 3).status, 403);  // cooling down
  // Another key holds window 1 and is challenged afresh; another window's bytes are wrong too.
  ApiResponse c = Claim(keys_[5], 1, kT0 + 3);
  ASSERT_EQ(c.status, 201);
  const int64_t id = Body(c)["claim"].get<int64_t>();
  const json b2 = Body(Beat(keys_[5], id, -1, kT0 + 4));
  EXPECT_NE(b2["challenge"]["nonce"], beat["challenge"]["nonce"]);
  EXPECT_EQ(Prove(keys_[5], id, -1, kT0 + 4, Answer(b2, 0)).status, 403);
  // So is the right bytes' answer under a stale nonce.
  ApiResponse c3 = Claim(keys_[6], 1, kT0 + 5);
  ASSERT_EQ(c3.status, 201);
  const int64_t id3 = Body(c3)["claim"].get<int64_t>();
  EXPECT_EQ(Prove(keys_[6], id3, -1, kT0 + 5, Answer(b2, 1)).status, 403);
  EXPECT_EQ(State(kT0 + 5, 1), "uncovered");
}

TEST_F(EvictTest, AtTheDeadlineOnlyHoldersThatHaveNotProvedTheirBytesAreEvicted) {
  Policy(false, ModelWithSamples());
  const auto ids = FillRing(kT0);
  // Windows 0 and 1 prove their bytes but cannot serve (window 2 never links); 2 never proves.
  for (int w = 0; w < 2; ++w) {
    const json beat = Body(Beat(keys_[w], ids[w], -1, kT0 + 1));
    ASSERT_EQ(Prove(keys_[w], ids[w], -1, kT0 + 2, Answer(beat, w)).status, 200);
  }
  EXPECT_EQ(State(kT0 + 11, 2), "uncovered");
  EXPECT_EQ(State(kT0 + 11, 0), "claimed");
  EXPECT_EQ(State(kT0 + 11, 1), "claimed");
}

// A squatter cannot keep its deadline from running by keeping the ring incomplete (keys that
// release before their own deadline): proving the bytes needs no neighbour.
TEST_F(EvictTest, AHolderThatNeverProvesItsBytesIsEvictedInAnIncompleteRingToo) {
  Policy(false, ModelWithSamples());
  ASSERT_EQ(Claim(keys_[0], 0, kT0).status, 201);
  EXPECT_EQ(State(kT0 + 9, 0), "claimed");
  EXPECT_EQ(State(kT0 + 10.5, 0), "uncovered");
}

TEST_F(EvictTest, MalformedProofsNameWhatIsWrong) {
  Policy(false, ModelWithSamples());
  const auto ids = FillRing(kT0);
  for (const json& bad : {json("x"), json{{"nonce", "zz"}, {"digests", json::array()}},
                          json{{"nonce", std::string(32, 'a')}, {"digests", 7}},
                          json{{"nonce", std::string(32, 'a')}, {"digests", {"abc"}}}}) {
    ApiResponse r = Prove(keys_[0], ids[0], -1, kT0 + 1, bad);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(Reason(r).find("field 'proof"), std::string::npos) << Reason(r);
  }
  EXPECT_EQ(State(kT0 + 1, 0), "claimed");
}

}  // namespace
}  // namespace kvasir::market
