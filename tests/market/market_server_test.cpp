// The market over real HTTP: racing claimers, body and header limits, slow and silent clients,
// and the client library against the server.
#include "market/market_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "market/market_client.h"
#include "market_test_util.h"
#include "net/stream.h"
#include "test_assets.h"

namespace kvasir::market {
namespace {

using kvasir::testing::KeyN;
using nlohmann::json;

class MarketServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = Store::Open(dir_.File("market.sqlite"));
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_ = std::move(s).value();
    ASSERT_TRUE(store_->AddModel(kvasir::testing::TestModel(), false, UnixNow()).ok());
    api_ = std::make_unique<MarketApi>(store_.get(), MarketConfig{});
    MarketServerOptions o;
    o.listen = "127.0.0.1:0";
    o.request_timeout_ms = 1500;
    o.idle_timeout_ms = 1500;
    auto srv = MarketServer::Start(o, api_.get());
    ASSERT_TRUE(srv.ok()) << srv.status().message();
    server_ = std::move(srv).value();
    url_ = "http://127.0.0.1:" + std::to_string(server_->port());
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  MarketClient Client(std::shared_ptr<const ring::NodeKey> key) {
    auto c = MarketClient::Create(url_, std::move(key));
    EXPECT_TRUE(c.ok());
    return std::move(c).value();
  }
  // Sends raw bytes and returns what the server answers until it closes (at most 5 s).
  std::string Raw(const std::string& bytes) {
    auto s = net::DialTcp("127.0.0.1", server_->port(), 2000);
    EXPECT_TRUE(s.ok());
    if (!s.ok()) return "";
    (void)(*s)->WriteAll(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                  bytes.size()));
    std::string out;
    uint8_t buf[4096];
    while (true) {
      auto n = (*s)->ReadSome(buf);
      if (!n.ok() || *n == 0) break;
      out.append(reinterpret_cast<const char*>(buf), *n);
    }
    return out;
  }

  kvasir::testing::TempDir dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<MarketApi> api_;
  std::unique_ptr<MarketServer> server_;
  std::string url_;
};

TEST_F(MarketServerTest, ExactlyOneOf32ConcurrentClaimersWins) {
  constexpr int kClaimers = 32;
  std::atomic<int> won{0}, lost{0}, other{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClaimers; ++i) {
    threads.emplace_back([&, i] {
      auto key = std::make_shared<const ring::NodeKey>(KeyN(100 + i));
      MarketClient c = Client(key);
      while (!go) std::this_thread::yield();
      auto r = c.PostSigned("/v1/claims",
                            {{"model", "tiny"}, {"ring", 0}, {"window", 1}, {"address", ":7001"}});
      if (r.ok()) ++won;
      else if (r.status().code() == StatusCode::kConflict) ++lost;
      else ++other;
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(lost.load(), kClaimers - 1);
  EXPECT_EQ(other.load(), 0);
  auto map = Client(nullptr).Get("/v1/map");
  ASSERT_TRUE(map.ok());
  EXPECT_EQ((*map)["models"][0]["rings"][0]["windows"][1]["state"], "claimed");
}

TEST_F(MarketServerTest, TheClientSignsAndTheServerAnswersWithCodes) {
  auto key = std::make_shared<const ring::NodeKey>(KeyN(1));
  MarketClient c = Client(key);
  auto grant = c.PostSigned("/v1/claims",
                            {{"model", "tiny"}, {"ring", 0}, {"window", 0}, {"address", ":7001"}});
  ASSERT_TRUE(grant.ok()) << grant.status().message();
  EXPECT_EQ((*grant)["first"], 0);
  auto missing = c.PostSigned("/v1/claims",
                              {{"model", "none"}, {"ring", 0}, {"window", 0}, {"address", ":1"}});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no model named 'none'"), std::string::npos);
  auto unsigned_claim = Client(nullptr).Post("/v1/claims", {{"model", "tiny"}});
  EXPECT_EQ(unsigned_claim.status().code(), StatusCode::kUnauthenticated);
  auto health = Client(nullptr).Get("/health");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ((*health)["claims"], 1);
}

TEST_F(MarketServerTest, AnOversizedBodyIsRefusedOnItsLengthBeforeItIsRead) {
  const std::string reply = Raw(
      "POST /v1/receipts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: 2000000000\r\n\r\n{");
  EXPECT_NE(reply.find("HTTP/1.1 413"), std::string::npos) << reply;
  EXPECT_NE(reply.find("too_large"), std::string::npos);
  // Chunked, without a length: cut at the limit.
  std::string chunked = "POST /v1/receipts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string piece(64 * 1024, 'a');
  for (int i = 0; i < 17; ++i) chunked += "10000\r\n" + piece + "\r\n";
  EXPECT_NE(Raw(chunked).find("HTTP/1.1 413"), std::string::npos);
  std::string big_header = "GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(9000, 'p') +
                           "\r\n\r\n";
  EXPECT_NE(Raw(big_header).find("HTTP/1.1 431"), std::string::npos);
  // The server still answers.
  EXPECT_TRUE(Client(nullptr).Get("/health").ok());
}

TEST_F(MarketServerTest, GarbageAndSilentClientsAreDroppedWithoutHurtingOthers) {
  EXPECT_EQ(Raw("\x16\x03\x01 not http at all\r\n\r\n").find("HTTP/1.1 200"), std::string::npos);
  // A client that opens a connection and says nothing is dropped after the request timeout.
  auto silent = net::DialTcp("127.0.0.1", server_->port(), 2000);
  ASSERT_TRUE(silent.ok());
  EXPECT_TRUE(Client(nullptr).Get("/v1/map").ok());
  uint8_t buf[16];
  const auto start = std::chrono::steady_clock::now();
  auto n = (*silent)->ReadSome(buf);
  EXPECT_TRUE(!n.ok() || *n == 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_GE(server_->stats().refused, 1u);
}

TEST_F(MarketServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  const std::string two =
      "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/map HTTP/1.1\r\nHost: x\r\nConnection: "
      "close\r\n\r\n";
  const std::string reply = Raw(two);
  size_t first = reply.find("HTTP/1.1 200");
  ASSERT_NE(first, std::string::npos);
  EXPECT_NE(reply.find("HTTP/1.1 200", first + 1), std::string::npos);
}

}  // namespace
}  // namespace kvasir::market
