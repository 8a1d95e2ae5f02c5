// The server's flushing thread (market_server.h): renewals answered through the server reach the
// database without any request flushing them, and a stop writes what waits.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <thread>

#include "market/market_client.h"
#include "market/market_server.h"
#include "market_test_util.h"
#include "test_assets.h"

namespace kvasir::market {
namespace {

// The written lease of every claim, as another process on the database sees it.
std::map<int64_t, double> WrittenLeases(const std::string& db) {
  std::map<int64_t, double> out;
  auto other = Store::Open(db);
  EXPECT_TRUE(other.ok()) << other.status().message();
  if (!other.ok()) return out;
  other.value()->set_lease_s(30);
  auto map = other.value()->Map(UnixNow());
  EXPECT_TRUE(map.ok()) << map.status().message();
  if (!map.ok()) return out;
  for (const RingState& r : (*map)[0].rings) {
    for (const WindowState& w : r.windows) {
      if (w.claim) out[w.claim->id] = w.claim->expires;
    }
  }
  return out;
}

TEST(MarketFlushThreadTest, RenewalsAnsweredThroughTheServerAreWrittenByItsThread) {
  kvasir::testing::TempDir dir;
  const std::string db = dir.File("market.sqlite");
  auto s = Store::Open(db);
  ASSERT_TRUE(s.ok()) << s.status().message();
  std::unique_ptr<Store> store = std::move(s).value();
  ASSERT_TRUE(store->AddModel(kvasir::testing::TestModel("tiny", 2), false, UnixNow()).ok());
  MarketConfig config;
  config.lease_s = 30;
  config.lease_flush_s = 0.4;
  MarketApi api(store.get(), config);
  MarketServerOptions o;
  o.listen = "127.0.0.1:0";
  auto srv = MarketServer::Start(o, &api);
  ASSERT_TRUE(srv.ok()) << srv.status().message();
  const std::string url = "http://127.0.0.1:" + std::to_string((*srv)->port());

  std::vector<MarketClient> nodes;
  std::vector<int64_t> claims;
  for (int k = 0; k < 6; ++k) {
    auto c = MarketClient::Create(
        url, std::make_shared<const ring::NodeKey>(kvasir::testing::KeyN(k + 1)));
    ASSERT_TRUE(c.ok()) << c.status().message();
    nodes.push_back(std::move(c).value());
    auto grant = nodes.back().PostSigned(
        "/v1/claims",
        {{"model", "tiny"}, {"ring", k / 3}, {"window", k % 3}, {"address", ":7001"}});
    ASSERT_TRUE(grant.ok()) << grant.status().message();
    claims.push_back((*grant)["claim"].get<int64_t>());
  }
  const std::map<int64_t, double> claimed = WrittenLeases(db);
  ASSERT_EQ(claimed.size(), 6u);
  for (size_t k = 0; k < nodes.size(); ++k) {
    auto beat = nodes[k].PostSigned("/v1/heartbeat", {{"claim", claims[k]}, {"serving_epoch", -1}});
    ASSERT_TRUE(beat.ok()) << beat.status().message();
  }
  // No request comes after the heartbeats: only the server's thread can write their renewals.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  size_t renewed = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    renewed = 0;
    for (const auto& [id, expires] : WrittenLeases(db)) renewed += expires > claimed.at(id);
    if (renewed == claims.size()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(renewed, claims.size());

  // Renewed again and stopped at once: the stop writes what waits.
  const std::map<int64_t, double> before_stop = WrittenLeases(db);
  for (size_t k = 0; k < nodes.size(); ++k) {
    auto beat = nodes[k].PostSigned("/v1/heartbeat", {{"claim", claims[k]}, {"serving_epoch", -1}});
    ASSERT_TRUE(beat.ok()) << beat.status().message();
  }
  (*srv)->Stop();
  for (const auto& [id, expires] : WrittenLeases(db)) EXPECT_GT(expires, before_stop.at(id));
}

}  // namespace
}  // namespace kvasir::market
