// MarketClient's kept-alive connections: requests (signed or not, from clients that share them)
// go over one connection, one the market closed while it idled is opened again, and a request
// that a server closed its connection on without answering goes once more, signed anew.
#include "market/market_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "market/market_server.h"
#include "market/signed_request.h"
#include "market_test_util.h"
#include "net/stream.h"
#include "test_assets.h"

namespace kvasir::market {
namespace {

using kvasir::testing::KeyN;

constexpr int kDeadlineMs = 10000;

class MarketClientTest : public ::testing::Test {
 protected:
  void Start(int idle_timeout_ms) {
    auto s = Store::Open(dir_.File("market.sqlite"));
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_ = std::move(s).value();
    ASSERT_TRUE(store_->AddModel(kvasir::testing::TestModel(), false, UnixNow()).ok());
    api_ = std::make_unique<MarketApi>(store_.get(), MarketConfig{});
    MarketServerOptions o;
    o.listen = "127.0.0.1:0";
    o.idle_timeout_ms = idle_timeout_ms;
    auto srv = MarketServer::Start(o, api_.get());
    ASSERT_TRUE(srv.ok()) << srv.status().message();
    server_ = std::move(srv).value();
    url_ = "http://127.0.0.1:" + std::to_string(server_->port());
  }
  MarketClient Client(std::shared_ptr<const ring::NodeKey> key) {
    auto c = MarketClient::Create(url_, std::move(key));
    EXPECT_TRUE(c.ok()) << c.status().message();
    return std::move(c).value();
  }
  int64_t Claim(const MarketClient& c, int window) {
    auto grant = c.PostSigned(
        "/v1/claims", {{"model", "tiny"}, {"ring", 0}, {"window", window}, {"address", ":7001"}});
    EXPECT_TRUE(grant.ok()) << grant.status().message();
    return grant.ok() ? (*grant)["claim"].get<int64_t>() : 0;
  }

  kvasir::testing::TempDir dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<MarketApi> api_;
  std::unique_ptr<MarketServer> server_;
  std::string url_;
};

TEST_F(MarketClientTest, RequestsOfClientsSharingConnectionsGoOverOne) {
  Start(30000);
  MarketClient reader = Client(nullptr);
  MarketClient a = reader.WithKey(std::make_shared<const ring::NodeKey>(KeyN(1)));
  MarketClient b = reader.WithKey(std::make_shared<const ring::NodeKey>(KeyN(2)));
  const int64_t ca = Claim(a, 0), cb = Claim(b, 1);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(a.PostSigned("/v1/heartbeat", {{"claim", ca}, {"serving_epoch", -1}}).ok());
    EXPECT_TRUE(b.PostSigned("/v1/heartbeat", {{"claim", cb}, {"serving_epoch", -1}}).ok());
    EXPECT_TRUE(reader.Get("/v1/map").ok());
  }
  // A's claim is not B's, on the same connection.
  auto theft = b.PostSigned("/v1/heartbeat", {{"claim", ca}, {"serving_epoch", -1}});
  EXPECT_EQ(theft.status().code(), StatusCode::kForbidden);
  EXPECT_EQ(reader.connects(), 1);
  EXPECT_EQ(server_->stats().connections, 1u);
  EXPECT_EQ(server_->stats().requests, 18u);
}

TEST_F(MarketClientTest, ThreadsTakeConnectionsOfTheirOwn) {
  Start(30000);
  MarketClient reader = Client(nullptr);
  constexpr int kThreads = static_cast<int>(MarketClient::kMaxIdleConnections), kEach = 10;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) ok += reader.Get("/health").ok() ? 1 : 0;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads * kEach);
  EXPECT_LE(reader.connects(), kThreads);
  EXPECT_GE(reader.connects(), 1);
}

TEST_F(MarketClientTest, AConnectionTheMarketClosedWhileIdleIsOpenedAgain) {
  Start(/*idle_timeout_ms=*/200);
  auto key = std::make_shared<const ring::NodeKey>(KeyN(3));
  MarketClient node = Client(key);
  const int64_t claim = Claim(node, 0);
  ASSERT_TRUE(server_->WaitFor(
      [](const MarketServerStats& s) { return s.open == 0 && s.proven == 0; }, kDeadlineMs))
      << "the market kept an idle connection past its idle deadline";
  auto beat = node.PostSigned("/v1/heartbeat", {{"claim", claim}, {"serving_epoch", -1}});
  EXPECT_TRUE(beat.ok()) << beat.status().message();
  EXPECT_EQ(node.connects(), 2);
}

// A server that answers the first request of its first connection, keeps it alive, reads the
// second request and closes without a word (as a server whose idle deadline passed just as the
// request arrived); every later connection gets one answer. Records each request's nonce.
class ClosingServer {
 public:
  ClosingServer() {
    auto l = net::Listener::Bind("127.0.0.1", 0);
    EXPECT_TRUE(l.ok());
    listener_ = std::make_unique<net::Listener>(std::move(l).value());
    thread_ = std::thread([this] { Serve(); });
  }
  ~ClosingServer() {
    listener_->Close();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(listener_->port()); }
  std::vector<std::string> Nonces() {
    std::lock_guard<std::mutex> lock(mu_);
    return nonces_;
  }

 private:
  // One request head and its body (Content-Length), or "" when the client closed.
  static std::string ReadRequest(net::Stream& s) {
    std::string in;
    uint8_t buf[4096];
    while (true) {
      const size_t head_end = in.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        const size_t at = in.find("Content-Length: ");
        const size_t body = at == std::string::npos ? 0 : std::stoul(in.substr(at + 16));
        if (in.size() >= head_end + 4 + body) return in;
      }
      auto n = s.ReadSome(buf);
      if (!n.ok() || *n == 0) return "";
      in.append(reinterpret_cast<const char*>(buf), *n);
    }
  }
  void Answer(net::Stream& s) {
    const std::string ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
    (void)s.WriteAll(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(ok.data()), ok.size()));
  }
  void Record(const std::string& request) {
    const std::string name = std::string(kNonceHeader) + ": ";
    const size_t at = request.find(name);
    if (at != std::string::npos) {
      std::lock_guard<std::mutex> lock(mu_);
      nonces_.push_back(
          request.substr(at + name.size(), request.find("\r\n", at) - at - name.size()));
    }
  }
  void Serve() {
    for (int conn = 0;; ++conn) {
      auto s = listener_->Accept();
      if (!s.ok()) return;
      std::string req = ReadRequest(**s);
      if (req.empty()) continue;
      Record(req);
      Answer(**s);
      if (conn > 0) continue;
      req = ReadRequest(**s);  // the second: closed unanswered
      Record(req);
    }
  }
  std::unique_ptr<net::Listener> listener_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> nonces_;  // of each request, in order
};

TEST(MarketClientRetryTest, ARequestClosedUnansweredOnAKeptConnectionGoesAgainSignedAnew) {
  ClosingServer server;
  auto c = MarketClient::Create(server.url(), std::make_shared<const ring::NodeKey>(KeyN(4)));
  ASSERT_TRUE(c.ok());
  auto first = c->PostSigned("/v1/heartbeat", {{"claim", 1}});
  ASSERT_TRUE(first.ok()) << first.status().message();
  auto second = c->PostSigned("/v1/heartbeat", {{"claim", 1}});
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(c->connects(), 2);
  const std::vector<std::string> nonces = server.Nonces();
  ASSERT_EQ(nonces.size(), 3u);
  EXPECT_NE(nonces[1], nonces[2]) << "the request went again with the same nonce";
}

}  // namespace
}  // namespace kvasir::market
