// Standbys through the market (docs/MARKET.md, "Standbys"), with real processes: a ring of
// `kvasir join` nodes serves 8 concurrent streaming sessions, the middle node is killed with
// kill -9, and a `kvasir join --standby` node, which the market named to the dead node's
// neighbours, takes its place: every client gets exactly its single-process output for the same
// seed (each client's pause is printed). When the dead node's lease lapses the market gives the
// window to the standby (its claim becomes the window's) and the ring is ready again without any
// stage restarting.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "kvasir_process.h"
#include "market/market_client.h"
#include "market/market_server.h"
#include "market/model_spec.h"
#include "market/ring_check.h"
#include "net/nginx_fixture.h"
#include "ring/client.h"
#include "ring/ring_test_util.h"
#include "ring/streaming_clients.h"
#include "test_assets.h"

namespace kvasir::market {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using testing::ChildProcess;

constexpr int kTokens = 160;  // per session: long enough to be mid-stream when a node dies
constexpr double kLeaseS = 8;

SamplingParams ClientSampling(int i) { return testing::StreamSampling(i, 2000); }
using testing::ClientRun;
using testing::StreamPrompt;

class StandbyRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::AssetPath("models/stories260K.gguf");
    if (!std::filesystem::exists(model_)) KV_SKIP_OR_FAIL("missing asset " + model_);
    testing::Nginx::Options no;
    no.root = testing::AssetPath("models");
    no.tls = false;
    std::string why;
    nginx_ = testing::Nginx::Start(no, &why);
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
    auto checker = StartStoreChecker(dir_.File("market.sqlite"));
    ASSERT_TRUE(checker.ok()) << checker.status().message();
    checker_ = std::move(checker).value();
    api_ = std::make_unique<MarketApi>(store_.get(), MarketConfig{kLeaseS, 120, "", "", {}, {}},
                                       checker_.get());
    MarketServerOptions so;
    so.listen = "127.0.0.1:0";
    auto srv = MarketServer::Start(so, api_.get());
    ASSERT_TRUE(srv.ok()) << srv.status().message();
    server_ = std::move(srv).value();
    url_ = fmt::format("http://127.0.0.1:{}", server_->port());
    client_.emplace(std::move(MarketClient::Create(url_, nullptr, {})).value());
  }
  void TearDown() override {
    if (::testing::Test::HasFailure()) {
      for (size_t i = 0; i < nodes_.size(); ++i) {
        const std::string log = nodes_[i]->log();
        std::fprintf(stderr, "---- node %zu ----\n%s\n", i,
                     log.substr(log.size() > 5000 ? log.size() - 5000 : 0).c_str());
      }
    }
    nodes_.clear();
    if (server_) server_->Stop();
    if (checker_) checker_->Stop();
  }

  // `kvasir join` as a process, on loopback port `port`, with a hot standby's timeouts.
  ChildProcess& Join(int n, uint16_t port, bool standby) {
    std::vector<std::string> args = {KVASIR_BINARY,
                                     "join",
                                     "--market",
                                     url_,
                                     "--key",
                                     dir_.File(fmt::format("node{}.key", n)),
                                     "--memory",
                                     "1GiB",
                                     "--cache",
                                     dir_.File(fmt::format("cache{}", n)),
                                     "--listen",
                                     fmt::format("127.0.0.1:{}", port),
                                     "--advertise",
                                     fmt::format("127.0.0.1:{}", port),
                                     "--poll",
                                     "0.2",
                                     "-t",
                                     "1",
                                     "--link-timeout",
                                     "2",
                                     "--repair-timeout",
                                     "20"};
    if (standby) args.push_back("--standby");
    nodes_.push_back(
        std::make_unique<ChildProcess>(args, dir_.File(fmt::format("node{}.log", n)), SIGTERM));
    return *nodes_.back();
  }
  json Map() {
    auto m = client_->Get("/v1/map");
    return m.ok() ? *m : json();
  }
  json Window(const json& map, int w) {
    return map["models"][0]["rings"][0]["windows"][static_cast<size_t>(w)];
  }
  bool WaitFor(double seconds, const std::function<bool(const json&)>& pred) {
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < until) {
      const json m = Map();
      if (!m.is_null() && pred(m)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "map now: " << Map().dump();
    return false;
  }
  static bool Ready(const json& m) { return m["models"][0]["rings"][0]["ready"].get<bool>(); }
  // Waits until `node`'s log has `text` (one of `texts`).
  static bool LogSays(const ChildProcess& node, const std::string& text, double seconds) {
    return LogSaysAny(node, {text}, seconds);
  }
  static bool LogSaysAny(const ChildProcess& node, const std::vector<std::string>& texts,
                         double seconds) {
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < until) {
      const std::string log = node.log();
      for (const std::string& text : texts) {
        if (log.find(text) != std::string::npos) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // `n` clients stream from the ring's head at once; once each has `before` tokens, `disturb`
  // runs.
  std::vector<ClientRun> StreamWhile(int n, int before, const std::function<void()>& disturb) {
    auto ring = client_->Get("/v1/rings/stories260K");
    EXPECT_TRUE(ring.ok()) << ring.status().message();
    if (!ring.ok()) return {};
    ring::ClientOptions co;
    co.head_key = *ring::ParsePublicKey((*ring)["head"]["node"].get<std::string>());
    co.token_timeout_ms = 60000;
    co.link_timeout_ms = 2000;
    return testing::StreamWhile((*ring)["head"]["address"].get<std::string>(), co, n, kTokens,
                                before, disturb, ClientSampling);
  }
  void ExpectUndisturbed(const std::vector<ClientRun>& runs, const std::string& what) {
    testing::ExpectUndisturbed(runs, what, kTokens, [&](int c) {
      return testing::GenerateLocally(model_, StreamPrompt(c), ClientSampling(c), kTokens,
                                      /*n_ctx=*/256, /*ignore_eog=*/true)
          .ids;
    });
  }

  testing::TempDir dir_;
  std::string model_, url_;
  std::unique_ptr<testing::Nginx> nginx_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<RingChecker> checker_;
  std::unique_ptr<MarketApi> api_;
  std::unique_ptr<MarketServer> server_;
  std::optional<MarketClient> client_;
  std::vector<std::unique_ptr<ChildProcess>> nodes_;
};

TEST_F(StandbyRingTest, AKilledMiddleNodeIsReplacedByAMarketStandbyAndClientsLoseNothing) {
  std::vector<uint16_t> ports;
  {
    // Free loopback ports, chosen now and given up for the nodes to bind.
    testing::BoundPorts held(4);
    for (int i = 0; i < 4; ++i) ports.push_back(held[static_cast<size_t>(i)]);
  }
  // Three nodes form the ring; which window each takes is the market's choice.
  for (int n = 0; n < 3; ++n) Join(n, ports[static_cast<size_t>(n)], false);
  ASSERT_TRUE(WaitFor(90, Ready));
  // The standby takes window 1 or 2 (both have none yet; not the head's), and serves its epoch
  // (its stage is up, waiting to be adopted).
  ChildProcess& standby = Join(3, ports[3], true);
  int window = -1;
  ASSERT_TRUE(WaitFor(60, [&](const json& m) {
    for (int w : {1, 2}) {
      const json s = Window(m, w)["standbys"];
      if (s.size() == 1 && s[0]["ready"].get<bool>()) window = w;
    }
    return window > 0 && Ready(m);
  }));
  // The page shows the standby in its window's cell (headless Chromium, as market_test.sh).
  {
    const std::string out = dir_.File("page");
    const int rc = std::system(fmt::format("bash {}/tests/integration/page_check.sh {}/ {} "
                                           ">{}/page_check.log 2>&1",
                                           KVASIR_SOURCE_DIR, url_, out, dir_.path())
                                   .c_str());
    if (WEXITSTATUS(rc) == 77) {
      std::printf("page check skipped: Chromium is not installed\n");
    } else {
      ASSERT_EQ(WEXITSTATUS(rc), 0) << testing::ReadFileToString(dir_.File("page_check.log"));
      const std::string page = testing::ReadFileToString(out + "/page.html");
      EXPECT_NE(page.find(fmt::format("data-window=\"{}\"", window)), std::string::npos);
      EXPECT_NE(page.find("data-standbys=\"1\""), std::string::npos) << page.substr(0, 3000);
    }
  }
  const json map = Map();
  const std::string victim_address = Window(map, window)["address"].get<std::string>();
  const int64_t standby_claim = Window(map, window)["standbys"][0]["claim"].get<int64_t>();
  size_t victim = nodes_.size();
  for (size_t i = 0; i < 3; ++i) {
    if (victim_address == fmt::format("127.0.0.1:{}", ports[i])) victim = i;
  }
  ASSERT_LT(victim, nodes_.size()) << victim_address;
  // The neighbours of the window know the standby (from their heartbeats).
  for (size_t i = 0; i < 3; ++i) {
    if (i == victim) continue;
    EXPECT_TRUE(LogSaysAny(
        *nodes_[i], {"1 standby(s) of the successor's window", "1 of the predecessor's"}, 20))
        << "node " << i;
  }
  auto restarts = [&](size_t i) {
    const std::string log = nodes_[i]->log();
    size_t n = 0;
    for (size_t at = log.find("stopping the stage"); at != std::string::npos;
         at = log.find("stopping the stage", at + 1)) {
      ++n;
    }
    return n;
  };
  std::vector<size_t> restarts_before;
  for (size_t i = 0; i < 4; ++i) restarts_before.push_back(restarts(i));
  auto runs = StreamWhile(8, 4, [&] { nodes_[victim]->Kill(SIGKILL); });
  ExpectUndisturbed(runs, fmt::format("kill -9 of window {}'s node, market standby", window));
  EXPECT_TRUE(LogSays(standby, "adopted by a predecessor", 1)) << standby.log();
  // The dead node's lease lapses: the standby's claim becomes the window's, and the ring is ready
  // again with the same stages (none restarted for it).
  ASSERT_TRUE(WaitFor(3 * kLeaseS + 30, [&](const json& m) {
    return Window(m, window)["claim"] == standby_claim && Ready(m);
  }));
  EXPECT_TRUE(LogSays(standby, "is the window's claim now", 5)) << standby.log();
  for (size_t i = 0; i < 4; ++i) {
    if (i != victim) {
      EXPECT_EQ(restarts(i), restarts_before[i]) << "node " << i << " restarted";
    }
  }
  auto after = StreamWhile(2, 0, [] {});
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].error, "");
    EXPECT_EQ(after[i].ids.size(), static_cast<size_t>(kTokens));
  }
}

// join's repair flags are checked before it contacts anything.
TEST(StandbyJoinFlagsTest, TheRepairFlagsAreCheckedBeforeAnythingRuns) {
  const std::vector<std::string> base = {"join", "--market", "http://127.0.0.1:1", "--memory",
                                         "1GiB"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::RunKvasir(args);
  };
  testing::ExpectUsageError(with({"--link-timeout", "0.1"}), "join",
                            "--link-timeout 0.1 must be from 0.5 to 600 seconds");
  testing::ExpectUsageError(with({"--repair-timeout", "-1"}), "join",
                            "--repair-timeout -1 must be from 0 to 3600 seconds");
}

}  // namespace
}  // namespace kvasir::market
