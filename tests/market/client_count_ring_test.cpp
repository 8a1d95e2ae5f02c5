// Client counts end to end (docs/PROTOCOL.md, "Client counts"): a RingClient with a key picks its
// session's receipt id and signs the count of rows it saw with its CLOSE; the head of a real
// ring of three stories260K stages puts the count in the session's receipt, and the market,
// whose ring those stages hold, credits the client's count. A count signed for another session
// is dropped by the head, and the receipt goes without it.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "market_fixture.h"
#include "model/model_id.h"
#include "ring/client.h"
#include "ring/receipt.h"
#include "ring/ring_test_util.h"
#include "ring/sampling_wire.h"

namespace kvasir::market {
namespace {

constexpr int kFirst[3] = {0, 1, 3}, kLast[3] = {1, 3, 5};  // LocalRing's windows of 5 layers

class ClientCountRingTest : public MarketFixture {
 protected:
  void SetUp() override {
    KV_REQUIRE_ASSET("models/stories260K.gguf");
    const std::string path = kvasir::testing::AssetPath("models/stories260K.gguf");
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok());
    auto id = ComputeModelId(f->header(), path);
    ASSERT_TRUE(id.ok());
    ModelSpec m;
    m.name = "tiny";
    m.model_id = ModelIdHex(*id);
    m.url = "http://files.invalid/stories260K.gguf";
    m.n_layer = 5;
    m.ctx = 256;
    m.max_rows_per_s = 1e6;
    std::vector<WindowSpec> ring;
    for (int w = 0; w < 3; ++w) {
      WindowSpec win;
      win.first = kFirst[w];
      win.last = kLast[w];
      win.bytes = 1000;
      win.memory = 100000;
      win.tensors.push_back({"blk.0.attn_q.weight", std::string(64, 'a')});
      ring.push_back(win);
    }
    m.rings.push_back(ring);
    Open(m, MarketConfig{7200, 120, "", "", {}, {}});
    local_ = kvasir::testing::LocalRing::Start(
        path, 3, wire::Dtype::kF32, 256, 64, 256, [&](int i, ring::StageOptions& o) {
          o.key = std::make_shared<const ring::NodeKey>(keys_[i]);
          o.row_store = std::make_shared<ring::RowStore>(ring::RowStoreOptions{});
          if (i == 0) {
            o.on_receipt = [this](std::vector<uint8_t> p) {
              std::lock_guard lock(mu_);
              payloads_.push_back(std::move(p));
              cv_.notify_all();
            };
          }
        });
    ASSERT_NE(local_, nullptr);
  }

  ring::GenerateResult Ask(const std::shared_ptr<const ring::NodeKey>& client_key) {
    ring::ClientOptions o;
    o.connect_timeout_ms = 20000;
    o.ring_secret = kvasir::testing::kTestRingSecret;
    o.client_key = client_key;
    auto client = ring::RingClient::Connect(local_->head(), o);
    EXPECT_TRUE(client.ok()) << client.status().message();
    if (!client.ok()) return {};
    ring::GenerateMsg req;
    req.prompt = "Once upon a time";
    req.sampling = ring::SamplingToWire(kvasir::testing::Greedy(), 8, false);
    auto r = (*client)->Generate(req, [](const ring::TokenMsg&) {});
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : ring::GenerateResult{};
  }

  ring::Receipt NextReceipt(size_t n) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(20), [&] { return payloads_.size() >= n; });
    EXPECT_GE(payloads_.size(), n);
    if (payloads_.size() < n) return {};
    auto r = ring::ParseReceipt(payloads_[n - 1]);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : ring::Receipt{};
  }

  std::unique_ptr<kvasir::testing::LocalRing> local_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<uint8_t>> payloads_;
};

TEST_F(ClientCountRingTest, TheHeadCarriesTheClientsCountAndTheMarketCreditsIt) {
  const auto ids = FillRing(kT0);
  MakeReady(ids, kT0);
  auto client_key = std::make_shared<const ring::NodeKey>(kvasir::testing::KeyN(40));
  const ring::GenerateResult g = Ask(client_key);
  ASSERT_TRUE(g.receipt_id.has_value());
  ASSERT_GT(g.vouched, 0u);
  EXPECT_EQ(g.vouched, static_cast<uint64_t>(g.n_prompt + g.n_generated - 1));

  const ring::Receipt r = NextReceipt(1);
  EXPECT_EQ(r.id, *g.receipt_id) << "the receipt id the client picked";
  ASSERT_TRUE(r.client.has_value()) << "the head put the client's count in";
  EXPECT_EQ(r.client->client, client_key->public_key());
  EXPECT_EQ(r.client->tokens, g.vouched);
  EXPECT_TRUE(ring::VerifyReceipt(r).ok()) << ring::VerifyReceipt(r).message();
  ASSERT_EQ(r.lines.size(), 3u);

  ApiResponse sub = Submit(r, kT0 + 10);
  ASSERT_EQ(sub.status, 200) << sub.body;
  const nlohmann::json credited = kvasir::testing::Body(sub)["credited"];
  ASSERT_EQ(credited.size(), 3u);
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(credited[w]["work"].get<uint64_t>(), g.vouched * (kLast[w] - kFirst[w])) << w;
  }
}

TEST_F(ClientCountRingTest, AClientWithoutAKeySendsNoCount) {
  const ring::GenerateResult g = Ask(nullptr);
  EXPECT_FALSE(g.receipt_id.has_value());
  const ring::Receipt r = NextReceipt(1);
  EXPECT_FALSE(r.client.has_value());
  EXPECT_TRUE(ring::VerifyReceipt(r).ok());
}

}  // namespace
}  // namespace kvasir::market
