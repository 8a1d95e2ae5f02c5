// `kvasir market` killed with kill -9 while nodes heartbeat (their renewals partly in memory,
// docs/MARKET.md, "Renewals in memory") and started again after every lease it answered ran out:
// no claim lapses, and the nodes go on heartbeating.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "market/market_client.h"
#include "market/market_server.h"
#include "market_test_util.h"
#include "net/server_process.h"
#include "test_assets.h"

namespace kvasir::market {
namespace {

using kvasir::testing::KeyN;

std::unique_ptr<testing::ServerProcess> StartMarket(const std::string& db, std::string* url) {
  auto p = std::make_unique<testing::ServerProcess>(
      std::vector<std::string>{"market", "--db", db, "--listen", "127.0.0.1:0", "--lease", "3",
                               "--lease-flush", "1", "--log-level", "warn"});
  const std::string line = p->WaitForLine("market: listening on", 60000);
  EXPECT_NE(line, "") << p->output();
  *url = "http://127.0.0.1:" + std::to_string(testing::ServerProcess::PortIn(line));
  return p;
}

TEST(MarketRestartTest, AMarketKilledWithRenewalsInMemoryLapsesNoClaimWhenItComesBack) {
  kvasir::testing::TempDir dir;
  const std::string db = dir.File("market.sqlite");
  {
    auto store = Store::Open(db);
    ASSERT_TRUE(store.ok()) << store.status().message();
    ASSERT_TRUE((*store)->AddModel(kvasir::testing::TestModel(), false, UnixNow()).ok());
  }
  std::string url;
  auto market = StartMarket(db, &url);
  std::vector<MarketClient> nodes;
  std::vector<int64_t> claims;
  for (int w = 0; w < 3; ++w) {
    auto c = MarketClient::Create(url, std::make_shared<const ring::NodeKey>(KeyN(40 + w)));
    ASSERT_TRUE(c.ok());
    auto grant = c->PostSigned(
        "/v1/claims", {{"model", "tiny"}, {"ring", 0}, {"window", w}, {"address", ":7001"}});
    ASSERT_TRUE(grant.ok()) << grant.status().message();
    claims.push_back((*grant)["claim"].get<int64_t>());
    nodes.push_back(std::move(c).value());
  }
  // Heartbeats for 2 s (past two flushes), as fast as they are answered.
  double last_answer = 0;
  int beats = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < until) {
    for (int w = 0; w < 3; ++w) {
      auto r = nodes[static_cast<size_t>(w)].PostSigned(
          "/v1/heartbeat", {{"claim", claims[static_cast<size_t>(w)]}, {"serving_epoch", -1}});
      ASSERT_TRUE(r.ok()) << r.status().message();
      last_answer = UnixNow();
      ++beats;
    }
  }
  ASSERT_EQ(::kill(market->pid(), SIGKILL), 0);
  market.reset();
  // Back only once even the last renewal answered has run out (lease 3 s).
  while (UnixNow() < last_answer + 3.5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  market = StartMarket(db, &url);
  auto reader = MarketClient::Create(url, nullptr);
  ASSERT_TRUE(reader.ok());
  auto map = reader->Get("/v1/map");
  ASSERT_TRUE(map.ok()) << map.status().message();
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ((*map)["models"][0]["rings"][0]["windows"][static_cast<size_t>(w)].value("claim",
                                                                                       int64_t{0}),
              claims[static_cast<size_t>(w)])
        << "after " << beats << " heartbeats";
  }
  // The nodes' kept connections died with the market: they reconnect and renew.
  for (int w = 0; w < 3; ++w) {
    auto again = MarketClient::Create(url, std::make_shared<const ring::NodeKey>(KeyN(40 + w)));
    ASSERT_TRUE(again.ok());
    auto r = again->PostSigned("/v1/heartbeat",
                               {{"claim", claims[static_cast<size_t>(w)]}, {"serving_epoch", -1}});
    EXPECT_TRUE(r.ok()) << r.status().message();
  }
}

}  // namespace
}  // namespace kvasir::market
