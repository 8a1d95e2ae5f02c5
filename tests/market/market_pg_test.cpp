// Several `kvasir market` processes on one PostgreSQL database (docs/MARKET.md, "The store"):
// 32 claimers racing through two processes for one window, exactly one wins; 32 racing for every
// window of a model get one winner each (and the reward of the rest agrees); a process killed
// (SIGKILL) while claims go through it loses none it answered, and the other process goes on;
// every 409 of 32 claimers racing for twelve windows names the claimer that holds the window; a
// heartbeat answered by one process is refused as a replay by the other.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "market/market_client.h"
#include "market/market_server.h"
#include "market/signed_request.h"
#include "market_test_util.h"
#include "net/server_process.h"
#include "pg_server.h"
#include "raw_client.h"

namespace kvasir::market {
namespace {

using kvasir::testing::KeyN;

class MarketPostgresTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    auto* pg = kvasir::testing::PgServer::Shared(&why);
    if (pg == nullptr) KV_SKIP_OR_FAIL("PostgreSQL: " + why);
    url_ = pg->NewDatabase();
    ASSERT_NE(url_, "");
    auto store = Store::Open(url_);
    ASSERT_TRUE(store.ok()) << store.status().message();
    ASSERT_TRUE((*store)->AddModel(kvasir::testing::TestModel("tiny", 16), false, UnixNow()).ok());
    for (int i = 0; i < 2; ++i) StartMarket();
  }
  void StartMarket() {
    markets_.push_back(std::make_unique<testing::ServerProcess>(std::vector<std::string>{
        "market", "--db", url_, "--listen", "127.0.0.1:0", "--log-level", "warn"}));
    const std::string line = markets_.back()->WaitForLine("market: listening on", 60000);
    ASSERT_NE(line, "") << markets_.back()->output();
    urls_.push_back("http://127.0.0.1:" + std::to_string(testing::ServerProcess::PortIn(line)));
  }
  MarketClient Client(int market, std::shared_ptr<const ring::NodeKey> key) {
    net::HttpRequestOptions http;
    http.timeout_ms = 10000;
    return std::move(MarketClient::Create(urls_[static_cast<size_t>(market)], std::move(key), http))
        .value();
  }
  std::string url_;
  std::vector<std::unique_ptr<testing::ServerProcess>> markets_;
  std::vector<std::string> urls_;
};

TEST_F(MarketPostgresTest, ExactlyOneOf32ClaimersRacingThroughTwoProcessesWins) {
  constexpr int kClaimers = 32;
  std::atomic<int> won{0}, lost{0}, other{0};
  std::atomic<bool> go{false};
  std::mutex mu;
  std::string others;
  std::vector<std::thread> threads;
  for (int i = 0; i < kClaimers; ++i) {
    threads.emplace_back([&, i] {
      MarketClient c = Client(i % 2, std::make_shared<const ring::NodeKey>(KeyN(100 + i)));
      while (!go) std::this_thread::yield();
      auto r = c.PostSigned("/v1/claims",
                            {{"model", "tiny"}, {"ring", 0}, {"window", 1}, {"address", ":7001"}});
      if (r.ok()) {
        ++won;
      } else if (r.status().code() == StatusCode::kConflict) {
        ++lost;
      } else {
        ++other;
        std::lock_guard<std::mutex> lock(mu);
        others += r.status().message() + "\n";
      }
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(lost.load(), kClaimers - 1);
  EXPECT_EQ(other.load(), 0) << others;
  for (int m = 0; m < 2; ++m) {
    auto map = Client(m, nullptr).Get("/v1/map");
    ASSERT_TRUE(map.ok());
    EXPECT_EQ((*map)["models"][0]["rings"][0]["windows"][1]["state"], "claimed");
  }
}

// 32 claimers, half through each process, each trying the 48 windows (16 rings of 3) from a place
// of its own until it holds one: every window has at most one holder, every claimer exactly one,
// and both processes see the same map, with the reward of the 16 windows left.
TEST_F(MarketPostgresTest, ThirtyTwoClaimersRacingForEveryWindowGetOneWinnerEach) {
  constexpr int kClaimers = 32, kWindows = 48;
  std::atomic<bool> go{false};
  std::mutex mu;
  std::vector<int> held(kClaimers, -1);
  std::string errors;
  std::vector<std::thread> threads;
  for (int i = 0; i < kClaimers; ++i) {
    threads.emplace_back([&, i] {
      MarketClient c = Client(i % 2, std::make_shared<const ring::NodeKey>(KeyN(500 + i)));
      while (!go) std::this_thread::yield();
      for (int k = 0; k < kWindows; ++k) {
        const int w = (i * 7 + k) % kWindows;
        auto r = c.PostSigned(
            "/v1/claims",
            {{"model", "tiny"}, {"ring", w / 3}, {"window", w % 3}, {"address", ":7001"}});
        std::lock_guard<std::mutex> lock(mu);
        if (r.ok()) {
          held[static_cast<size_t>(i)] = w;
          return;
        }
        if (r.status().code() != StatusCode::kConflict) errors += r.status().message() + "\n";
      }
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors, "");
  std::vector<int> holders(kWindows, 0);
  for (int i = 0; i < kClaimers; ++i) {
    ASSERT_GE(held[static_cast<size_t>(i)], 0) << "claimer " << i << " holds nothing";
    ++holders[static_cast<size_t>(held[static_cast<size_t>(i)])];
  }
  for (int w = 0; w < kWindows; ++w) EXPECT_LE(holders[static_cast<size_t>(w)], 1) << w;
  const double rate = RewardRate(0, kWindows - kClaimers, kWindows);
  for (int m = 0; m < 2; ++m) {
    auto map = Client(m, nullptr).Get("/v1/map");
    ASSERT_TRUE(map.ok()) << map.status().message();
    int claimed = 0;
    for (const auto& r : (*map)["models"][0]["rings"]) {
      for (const auto& w : r["windows"]) {
        const int index = 3 * r["ring"].get<int>() + w["window"].get<int>();
        const bool has = w.value("holder", std::string()) != "";
        EXPECT_EQ(has, holders[static_cast<size_t>(index)] == 1) << "market " << m << ": " << w;
        if (has) {
          ++claimed;
        } else {
          EXPECT_DOUBLE_EQ(w["rate"].get<double>(), rate) << w;
        }
      }
    }
    EXPECT_EQ(claimed, kClaimers) << "market " << m;
  }
}

// 32 claimers, half through each process, each trying the 12 windows of rings 0 to 3 in an order
// of its own until it holds one: every window has exactly one winner, and every 409 names the
// window asked for and a holder of it that is another claimer and still holds it at the end (a
// serialization failure or a unique violation between the processes is run again, never
// answered as a conflict on a guess).
TEST_F(MarketPostgresTest, EveryConflictNamesTheClaimerThatHoldsTheWindow) {
  constexpr int kClaimers = 32, kWindows = 12;
  struct Refusal {
    int claimer, window;
    std::string message;
  };
  std::atomic<bool> go{false};
  std::mutex mu;
  std::vector<Refusal> refusals;
  std::vector<int> won(kClaimers, -1);
  std::string errors;
  std::vector<std::thread> threads;
  for (int i = 0; i < kClaimers; ++i) {
    threads.emplace_back([&, i] {
      MarketClient c = Client(i % 2, std::make_shared<const ring::NodeKey>(KeyN(700 + i)));
      std::vector<int> order(kWindows);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(i)));
      while (!go) std::this_thread::yield();
      for (int w : order) {
        auto r = c.PostSigned(
            "/v1/claims",
            {{"model", "tiny"}, {"ring", w / 3}, {"window", w % 3}, {"address", ":7001"}});
        std::lock_guard<std::mutex> lock(mu);
        if (r.ok()) {
          won[static_cast<size_t>(i)] = w;
          return;
        }
        if (r.status().code() == StatusCode::kConflict) {
          refusals.push_back({i, w, r.status().message()});
        } else {
          errors += r.status().message() + "\n";
        }
      }
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors, "");
  std::vector<int> winners(kWindows, 0);
  for (int w : won) {
    if (w >= 0) ++winners[static_cast<size_t>(w)];
  }
  // Twenty of them lost every window they tried, which were all twelve: all are held.
  for (int w = 0; w < kWindows; ++w) EXPECT_EQ(winners[static_cast<size_t>(w)], 1) << w;
  auto map = Client(1, nullptr).Get("/v1/map");
  ASSERT_TRUE(map.ok()) << map.status().message();
  const auto& rings = (*map)["models"][0]["rings"];
  ASSERT_FALSE(refusals.empty());
  for (const Refusal& f : refusals) {
    const auto& w =
        rings[static_cast<size_t>(f.window / 3)]["windows"][static_cast<size_t>(f.window % 3)];
    const std::string holder = w.value("holder", std::string());
    ASSERT_NE(holder, "") << w;
    EXPECT_NE(holder, ring::PublicKeyHex(KeyN(700 + f.claimer).public_key()));
    const std::string want = fmt::format("window {} of ring {} of 'tiny' is held by node {}",
                                         f.window % 3, f.window / 3, holder.substr(0, 8));
    EXPECT_NE(f.message.find(want), std::string::npos)
        << "claimer " << f.claimer << ": " << f.message << "; expected: " << want;
  }
}

TEST_F(MarketPostgresTest, AProcessKilledMidClaimLosesNothingItAnswered) {
  // 48 nodes claim a window each (16 rings of 3) through market 0, 8 at a time; market 0 is
  // killed once 12 claims were answered.
  constexpr int kNodes = 48;
  std::mutex mu;
  std::vector<std::pair<int, int64_t>> answered;  // node, claim
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < kNodes; i = next++) {
        MarketClient c = Client(0, std::make_shared<const ring::NodeKey>(KeyN(300 + i)));
        auto r = c.PostSigned(
            "/v1/claims",
            {{"model", "tiny"}, {"ring", i / 3}, {"window", i % 3}, {"address", ":7001"}});
        if (!r.ok()) continue;  // market 0 is gone
        std::lock_guard<std::mutex> lock(mu);
        answered.emplace_back(i, (*r)["claim"].get<int64_t>());
      }
    });
  }
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (answered.size() >= 12) break;
    }
    std::this_thread::yield();
  }
  ASSERT_EQ(::kill(markets_[0]->pid(), SIGKILL), 0);
  for (auto& t : threads) t.join();
  // Every answered claim is there, seen through market 1; a claim that was under way when the
  // process died is either there whole or not at all, and claiming it again through market 1
  // settles it (renewed or new), never a second holder.
  auto map = Client(1, nullptr).Get("/v1/map");
  ASSERT_TRUE(map.ok()) << map.status().message();
  const auto& rings = (*map)["models"][0]["rings"];
  for (auto [i, claim] : answered) {
    const auto& w = rings[static_cast<size_t>(i / 3)]["windows"][static_cast<size_t>(i % 3)];
    EXPECT_EQ(w.value("claim", int64_t{0}), claim) << w;
    EXPECT_EQ(w.value("holder", std::string()), ring::PublicKeyHex(KeyN(300 + i).public_key()));
  }
  EXPECT_LT(answered.size(), size_t{kNodes});  // the kill came mid-way
  for (int i = 0; i < kNodes; ++i) {
    MarketClient c = Client(1, std::make_shared<const ring::NodeKey>(KeyN(300 + i)));
    auto r =
        c.PostSigned("/v1/claims",
                     {{"model", "tiny"}, {"ring", i / 3}, {"window", i % 3}, {"address", ":7001"}});
    EXPECT_TRUE(r.ok()) << i << ": " << r.status().message();
  }
  auto after = Client(1, nullptr).Get("/v1/map");
  ASSERT_TRUE(after.ok());
  for (int i = 0; i < kNodes; ++i) {
    const auto& w = (*after)["models"][0]["rings"][static_cast<size_t>(i / 3)]["windows"]
                            [static_cast<size_t>(i % 3)];
    EXPECT_EQ(w.value("holder", std::string()), ring::PublicKeyHex(KeyN(300 + i).public_key()));
  }
}

// A heartbeat's nonce is written in its own transaction on PostgreSQL (not held in memory as on
// SQLite): the same signed bytes sent to the other process are refused as a replay.
TEST_F(MarketPostgresTest, AHeartbeatReplayedToTheOtherProcessIsRefused) {
  auto key = std::make_shared<const ring::NodeKey>(KeyN(500));
  auto claimed = Client(0, key).PostSigned(
      "/v1/claims", {{"model", "tiny"}, {"ring", 0}, {"window", 0}, {"address", ":7001"}});
  ASSERT_TRUE(claimed.ok()) << claimed.status().message();
  const std::string body =
      nlohmann::json{{"claim", (*claimed)["claim"].get<int64_t>()}, {"serving_epoch", -1}}.dump();
  std::string req = "POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  for (const auto& [name, value] :
       SignRequest(*key, "POST", "/v1/heartbeat", body, static_cast<int64_t>(UnixNow()))) {
    req += name + ": " + value + "\r\n";
  }
  req += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  for (int m = 0; m < 2; ++m) {
    const std::string port =
        urls_[static_cast<size_t>(m)].substr(urls_[static_cast<size_t>(m)].rfind(':') + 1);
    testing::RawClient c(static_cast<uint16_t>(std::stoi(port)));
    ASSERT_TRUE(c.connected());
    c.Send(req);
    const std::string answer = c.ReadResponse();
    if (m == 0) {
      EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
    } else {
      EXPECT_EQ(answer.rfind("HTTP/1.1 401", 0), 0u) << answer;
      EXPECT_NE(answer.find("replayed"), std::string::npos) << answer;
    }
  }
}

}  // namespace
}  // namespace kvasir::market
