// `kvasir join` in one process, on loopback: a market, nginx serving stories260K, and Joiners that
// form a ring by themselves from an empty map, serve exactly the single-process tokens, get their
// receipts credited, and re-link when a node leaves and another takes its window. (The same with
// processes, kill -9 and a node behind NAT: tests/integration/market_test.sh.)
#include "market/joiner.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "market/market_client.h"
#include "market/market_server.h"
#include "market/model_spec.h"
#include "market_test_util.h"
#include "net/nginx_fixture.h"
#include "ring/client.h"
#include "ring/ring_test_util.h"
#include "ring/sampling_wire.h"
#include "test_assets.h"

namespace kvasir::market {
namespace {

using kvasir::testing::KeyN;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

class Node {
 public:
  Node(const std::string& market, int n, const std::string& cache) {
    JoinOptions o;
    o.market_url = market;
    o.key = std::make_shared<const ring::NodeKey>(KeyN(n));
    o.memory_bytes = uint64_t{1} << 30;
    o.cache_dir = cache;
    o.listen = "127.0.0.1:0";
    o.poll_s = 0.2;
    o.configure_stage = [](ring::StageOptions* s) {
      s->link_timeout_ms = 3000;
      s->n_ctx = 256;
    };
    key_hex = ring::PublicKeyHex(o.key->public_key());
    auto j = Joiner::Create(o);
    EXPECT_TRUE(j.ok()) << j.status().message();
    joiner = std::move(j).value();
    thread = std::thread([this] { EXPECT_TRUE(joiner->Run().ok()); });
  }
  ~Node() { Leave(); }
  void Leave() {
    if (!thread.joinable()) return;
    joiner->Stop();
    thread.join();
  }
  std::string key_hex;
  std::unique_ptr<Joiner> joiner;
  std::thread thread;
};

class JoinerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = kvasir::testing::AssetPath("models/stories260K.gguf");
    if (!std::filesystem::exists(model_)) KV_SKIP_OR_FAIL("missing asset " + model_);
    kvasir::testing::Nginx::Options no;
    no.root = kvasir::testing::AssetPath("models");
    no.tls = false;
    std::string why;
    nginx_ = kvasir::testing::Nginx::Start(no, &why);
    if (nginx_ == nullptr) KV_SKIP_OR_FAIL("nginx: " + why);
    auto s = Store::Open(dir_.File("market.sqlite"));
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_ = std::move(s).value();
    ModelSpecOptions mo;
    mo.model_path = model_;
    mo.url = nginx_->Url("/stories260K.gguf");
    mo.windows = 3;
    mo.ctx = 256;
    auto spec = BuildModelSpec(mo);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    ASSERT_TRUE(store_->AddModel(*spec, false, UnixNow()).ok());
    api_ = std::make_unique<MarketApi>(store_.get(), MarketConfig{4, 120, "", ""});
    MarketServerOptions so;
    so.listen = "127.0.0.1:0";
    auto srv = MarketServer::Start(so, api_.get());
    ASSERT_TRUE(srv.ok()) << srv.status().message();
    server_ = std::move(srv).value();
    url_ = "http://127.0.0.1:" + std::to_string(server_->port());
    client_.emplace(std::move(MarketClient::Create(url_, nullptr)).value());
  }
  void TearDown() override {
    nodes_.clear();
    if (server_) server_->Stop();
  }

  void AddNode(int n) {
    nodes_.push_back(std::make_unique<Node>(url_, n, dir_.File("cache-" + std::to_string(n))));
  }
  json Map() {
    auto m = client_->Get("/v1/map");
    return m.ok() ? *m : json();
  }
  // Waits (at most `seconds`) until `pred(map)` holds.
  bool WaitMap(double seconds, const std::function<bool(const json&)>& pred) {
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < until) {
      json m = Map();
      if (!m.is_null() && pred(m)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "map now: " << Map().dump();
    return false;
  }
  static bool Ready(const json& m) { return m["models"][0]["rings"][0]["ready"].get<bool>(); }

  kvasir::testing::Generation Generate() {
    kvasir::testing::Generation g;
    auto ring = client_->Get("/v1/rings/stories260K");
    EXPECT_TRUE(ring.ok()) << ring.status().message();
    if (!ring.ok()) return g;
    ring::ClientOptions co;
    co.head_key = *ring::ParsePublicKey((*ring)["head"]["node"].get<std::string>());
    co.connect_timeout_ms = 10000;
    auto c = ring::RingClient::Connect((*ring)["head"]["address"].get<std::string>(), co);
    EXPECT_TRUE(c.ok()) << c.status().message();
    if (!c.ok()) return g;
    ring::GenerateMsg req;
    req.prompt = "Once upon a time";
    req.sampling = ring::SamplingToWire(kvasir::testing::Greedy(), 16, false);
    auto r = (*c)->Generate(req, [&](const ring::TokenMsg& t) {
      if (t.token.finished && t.token.reason == static_cast<uint8_t>(wire::FinishReason::kEog)) return;
      g.ids.push_back(t.token.id);
      g.logits.push_back(t.token.logit);
    });
    EXPECT_TRUE(r.ok()) << r.status().message();
    return g;
  }

  kvasir::testing::TempDir dir_;
  std::string model_;
  std::unique_ptr<kvasir::testing::Nginx> nginx_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<MarketApi> api_;
  std::unique_ptr<MarketServer> server_;
  std::string url_;
  std::optional<MarketClient> client_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

TEST_F(JoinerTest, NodesFormARingServeItEarnCreditAndRelinkWhenOneLeaves) {
  for (int n = 1; n <= 3; ++n) AddNode(n);
  ASSERT_TRUE(WaitMap(60, Ready));
  const auto want = kvasir::testing::GenerateLocally(model_, "Once upon a time",
                                                     kvasir::testing::Greedy(), 16);
  const auto got = Generate();
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.logits, want.logits);  // bit for bit

  // The session's receipt credits all three.
  const auto until = Clock::now() + std::chrono::seconds(20);
  json balances;
  while (Clock::now() < until) {
    balances = *client_->Get("/v1/balances");
    if (balances["balances"].size() == 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(balances["balances"].size(), 3u) << balances.dump();
  ASSERT_EQ(balances["receipts"].size(), 1u);
  // prompt tokens + generated tokens - 1 (the last token is never fed back) rows on every stage.
  EXPECT_EQ(balances["receipts"][0]["lines"].size(), 3u);

  // Node 2 leaves cleanly: its claim is released at once; node 4 takes the window.
  const std::string gone = nodes_[1]->key_hex;
  nodes_[1]->Leave();
  ASSERT_TRUE(WaitMap(5, [&](const json& m) { return m.dump().find(gone) == std::string::npos; }));
  AddNode(4);
  ASSERT_TRUE(WaitMap(60, [&](const json& m) {
    return Ready(m) && m.dump().find(nodes_.back()->key_hex) != std::string::npos;
  }));
  const auto again = Generate();
  EXPECT_EQ(again.ids, want.ids);
  EXPECT_EQ(again.logits, want.logits);
  EXPECT_GE(nodes_[0]->joiner->state().stages_started + nodes_[2]->joiner->state().stages_started,
            3u);  // the neighbours of the replaced window re-linked
}

TEST_F(JoinerTest, ANodeWithTooLittleMemorySaysSoAndClaimsNothing) {
  JoinOptions o;
  o.market_url = url_;
  o.key = std::make_shared<const ring::NodeKey>(KeyN(9));
  o.memory_bytes = 1024;  // no window fits in 1 KiB
  o.cache_dir = dir_.File("cache-9");
  o.listen = "127.0.0.1:0";
  o.poll_s = 0.1;
  auto j = Joiner::Create(o);
  ASSERT_TRUE(j.ok());
  std::thread t([&] { EXPECT_TRUE((*j)->Run().ok()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  EXPECT_EQ((*j)->state().claim, 0);
  EXPECT_EQ(Map().dump().find("\"holder\""), std::string::npos);
  (*j)->Stop();
  t.join();
}

}  // namespace
}  // namespace kvasir::market
