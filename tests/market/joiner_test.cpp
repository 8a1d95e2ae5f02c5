// `kvasir join` in one process, on loopback: a market (with its checks of holders), nginx serving
// stories260K, and Joiners that form a ring by themselves from an empty map, serve exactly the
// single-process tokens, get their receipts credited, and re-link when a node leaves and another
// takes its window; a joiner whose neighbour is an impostor never serves; and `kvasir join` over
// TLS releases its claim on SIGINT. (The same with processes, kill -9 and a node behind NAT:
// tests/integration/market_test.sh.)
#include "market/joiner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <set>
#include <thread>

#include <signal.h>
#include <sys/wait.h>

#include "fake_holder.h"
#include "kvasir_process.h"
#include "market/market_client.h"
#include "market/market_server.h"
#include "market/model_spec.h"
#include "market/ring_check.h"
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
    mo.rings = Rings();
    mo.ctx = 256;
    auto spec = BuildModelSpec(mo);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    ASSERT_TRUE(store_->AddModel(*spec, false, UnixNow()).ok());
    auto checker = StartStoreChecker(dir_.File("market.sqlite"));
    ASSERT_TRUE(checker.ok()) << checker.status().message();
    checker_ = std::move(checker).value();
    api_ = std::make_unique<MarketApi>(
        store_.get(), MarketConfig{Lease(), 120, "", "", Eviction(), Audit()}, checker_.get());
    MarketServerOptions so;
    so.listen = "127.0.0.1:0";
    if (Tls()) {
      cert_ = dir_.File("cert.pem");
      const std::string why =
          kvasir::testing::MakeTestCertificate(cert_, dir_.File("key.pem"), "IP:127.0.0.1");
      if (!why.empty()) KV_SKIP_OR_FAIL("openssl cannot make a certificate: " + why);
      so.tls_cert = cert_;
      so.tls_key = dir_.File("key.pem");
    }
    auto srv = MarketServer::Start(so, api_.get());
    ASSERT_TRUE(srv.ok()) << srv.status().message();
    server_ = std::move(srv).value();
    url_ = (Tls() ? "https" : "http") + std::string("://127.0.0.1:") +
           std::to_string(server_->port());
    net::HttpRequestOptions http;
    http.ca_file = cert_;
    client_.emplace(std::move(MarketClient::Create(url_, nullptr, http)).value());
  }
  void TearDown() override {
    nodes_.clear();
    if (server_) server_->Stop();
    if (checker_) checker_->Stop();
  }
  virtual double Lease() const { return 4; }
  virtual bool Tls() const { return false; }
  virtual int Rings() const { return 1; }
  virtual EvictionPolicy Eviction() const { return {}; }
  virtual AuditPolicy Audit() const { return {}; }

  void AddNode(int n) {
    nodes_.push_back(std::make_unique<Node>(url_, n, dir_.File("cache-" + std::to_string(n))));
  }
  json Map() {
    auto m = client_->Get("/v1/map");
    return m.ok() ? *m : json();
  }
  // Waits (at most `seconds`) until `pred()` holds, looking again every 50 ms.
  static bool WaitFor(double seconds, const std::function<bool()>& pred) {
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < until) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return pred();
  }
  // Waits (at most `seconds`) until `pred(map)` holds.
  bool WaitMap(double seconds, const std::function<bool(const json&)>& pred) {
    if (WaitFor(seconds, [&] {
          json m = Map();
          return !m.is_null() && pred(m);
        })) {
      return true;
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
  std::string model_, cert_;
  std::unique_ptr<kvasir::testing::Nginx> nginx_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<RingChecker> checker_;
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

  // The market checked every holder before it named the ring to a client.
  const json formed = Map();
  for (const auto& w : formed["models"][0]["rings"][0]["windows"]) EXPECT_EQ(w["checked"], true);
  EXPECT_GE(checker_->stats().passed, 3u);
  // The session's receipt credits all three.
  json balances;
  EXPECT_TRUE(WaitFor(20, [&] {
    auto b = client_->Get("/v1/balances");
    if (b.ok()) balances = *b;
    return b.ok() && balances["balances"].size() == 3;
  }));
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
  // It has read the map several times and says why it waits.
  EXPECT_TRUE(WaitFor(30, [&] {
    const JoinState st = (*j)->state();
    return st.maps_read >= 3 && st.waiting.find("no uncovered window fits") != std::string::npos;
  })) << (*j)->state().waiting;
  EXPECT_EQ((*j)->state().claim, 0);
  EXPECT_EQ(Map().dump().find("\"holder\""), std::string::npos);
  (*j)->Stop();
  t.join();
}

// Windows 0 and 2 are claimed by keys the test holds, at an address where an impostor (another
// key) answers, and they lie that they serve. The joiner of window 1 dials its successor there and
// refuses it, again and again: it never serves, so the ring is never ready and no client is sent
// there. (The market's own check of such a holder: ring_check_test.)
TEST_F(JoinerTest, AJoinerRefusesAnImpostorNeighbour) {
  kvasir::testing::FakeHolder impostor({KeyN(99)});
  const auto k0 = std::make_shared<const ring::NodeKey>(KeyN(20));
  const auto k2 = std::make_shared<const ring::NodeKey>(KeyN(22));
  MarketClient c0 = std::move(MarketClient::Create(url_, k0)).value();
  MarketClient c2 = std::move(MarketClient::Create(url_, k2)).value();
  int64_t claims[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    auto g = (i == 0 ? c0 : c2)
                 .PostSigned("/v1/claims", {{"model", "stories260K"},
                                            {"ring", 0},
                                            {"window", 2 * i},
                                            {"address", impostor.address()}});
    ASSERT_TRUE(g.ok()) << g.status().message();
    claims[i] = (*g)["claim"].get<int64_t>();
  }
  AddNode(1);
  Node& node = *nodes_.back();
  const std::string refusal = "the successor: is node " + ring::ShortKey(KeyN(99).public_key()) +
                              ", expected node " + ring::ShortKey(k2->public_key());
  // The liars heartbeat "serving" the current epoch while the test waits for the refusals.
  EXPECT_TRUE(WaitFor(60, [&] {
    const json m = Map();
    if (m.is_null()) return false;
    const json& ring = m["models"][0]["rings"][0];
    for (int i = 0; i < 2; ++i) {
      (void)(i == 0 ? c0 : c2)
          .PostSigned("/v1/heartbeat",
                      {{"claim", claims[i]}, {"serving_epoch", ring["epoch"].get<int64_t>()}});
    }
    return impostor.ErrorsContaining(refusal) >= 2;
  })) << impostor.last_error() << "\n" << Map().dump();
  const JoinState st = node.joiner->state();
  EXPECT_GE(st.stages_started, 1u);
  EXPECT_EQ(st.serving_epoch, -1);
  const json ring = Map()["models"][0]["rings"][0];
  EXPECT_FALSE(ring["ready"].get<bool>()) << ring;
  EXPECT_EQ(ring["windows"][1]["state"], "claimed");
  auto pick = client_->Get("/v1/rings/stories260K");
  EXPECT_EQ(pick.status().code(), StatusCode::kUnavailable);
}

// Audits on a real ring: every credited session is audited, and the joiners reveal from their
// stages' row stores what their receipt lines committed to, so every holder passes (and keeps
// its credit and its claim).
class JoinerAuditTest : public JoinerTest {
 protected:
  AuditPolicy Audit() const override {
    AuditPolicy a;
    a.rate = 1;
    return a;
  }
};

TEST_F(JoinerAuditTest, HonestHoldersPassTheirAudits) {
  for (int n = 1; n <= 3; ++n) AddNode(n);
  ASSERT_TRUE(WaitMap(60, Ready));
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(Generate().ids.empty());
  auto passed = [&](json* last) {
    auto b = client_->Get("/v1/balances");
    if (!b.ok()) return false;
    *last = *b;
    int holders = 0;
    for (const json& x : (*b)["balances"]) {
      EXPECT_EQ(x["audits_failed"], 0) << x.dump();
      holders += x["audits_passed"].get<int>() == 2;
    }
    return holders == 3;
  };
  json last;
  EXPECT_TRUE(WaitFor(30, [&] { return passed(&last); })) << last.dump();
  for (const json& x : last["balances"]) EXPECT_GT(x["credit"].get<double>(), 0) << x.dump();
  EXPECT_TRUE(Ready(Map())) << "no holder lost its claim";
}

// The Sybil squat replayed: 50 keys claim every window they can (each as soon as one is uncovered,
// a faster loop than any joiner's), say they serve, and never fetch a byte; six honest joiners
// want the same two rings. Every squatter is evicted at its deadline (it never proves its bytes)
// and cools down for longer than the test, no honest holder is ever evicted, and both rings end
// up served by honest joiners: within the time the squatters' keys last (50 keys over 6 windows:
// 9 rounds of the deadline) plus a few deadlines for the joiners.
class JoinerSybilTest : public JoinerTest {
 protected:
  int Rings() const override { return 2; }
  EvictionPolicy Eviction() const override { return {kDeadline, 1e12, 3600}; }
  static constexpr double kDeadline = 4;
};

TEST_F(JoinerSybilTest, SquattersThatNeverServeAreEvictedAndHonestJoinersServe) {
  constexpr int kSquatters = 50;
  struct Squatter {
    std::optional<MarketClient> client;
    std::string key;
    int64_t claim = 0;
    int claims = 0;
    bool evicted = false, cooling = false;
  };
  std::vector<Squatter> sq(kSquatters);
  for (int i = 0; i < kSquatters; ++i) {
    auto k = std::make_shared<const ring::NodeKey>(KeyN(200 + i));
    sq[i].key = ring::PublicKeyHex(k->public_key());
    sq[i].client.emplace(std::move(MarketClient::Create(url_, k)).value());
  }
  std::atomic<bool> stop{false};
  std::atomic<int> honest_evicted{0};
  std::thread attack([&] {
    for (; !stop; std::this_thread::sleep_for(std::chrono::milliseconds(50))) {  // its pace
      const json m = Map();
      if (m.is_null()) continue;
      for (Squatter& s : sq) {
        if (s.cooling) continue;
        if (s.claim != 0) {
          // Lies that it serves the ring's current epoch.
          for (const auto& r : m["models"][0]["rings"]) {
            for (const auto& w : r["windows"]) {
              if (w.value("claim", int64_t{0}) != s.claim) continue;
              auto b = s.client->PostSigned(
                  "/v1/heartbeat", {{"claim", s.claim}, {"serving_epoch", r["epoch"]}});
              if (!b.ok()) s.claim = 0;
            }
          }
          if (m.dump().find(s.key) == std::string::npos) {
            s.claim = 0;
            s.evicted = true;
          }
          continue;
        }
        for (const auto& r : m["models"][0]["rings"]) {
          for (const auto& w : r["windows"]) {
            if (s.claim != 0 || s.cooling || w["state"] != "uncovered") continue;
            auto g = s.client->PostSigned("/v1/claims", {{"model", "stories260K"},
                                                         {"ring", r["ring"]},
                                                         {"window", w["window"]},
                                                         {"address", "127.0.0.1:9"}});
            if (g.ok()) {
              s.claim = (*g)["claim"].get<int64_t>();
              ++s.claims;
            } else if (g.status().code() == StatusCode::kForbidden) {
              s.cooling = true;
            }
          }
        }
      }
    }
  });
  const auto t0 = Clock::now();
  for (int n = 1; n <= 6; ++n) AddNode(n);
  std::vector<std::string> honest;
  for (const auto& n : nodes_) honest.push_back(n->key_hex);
  // Honest holders never lose a claim: a holder seen once stays until the end.
  std::set<std::string> seen;
  const double bound = (kSquatters / 6 + 1) * (kDeadline + 1) + 6 * kDeadline;
  const bool served = WaitMap(bound, [&](const json& m) {
    bool both = true;
    for (const auto& r : m["models"][0]["rings"]) {
      both = both && r["ready"].get<bool>();
      for (const auto& w : r["windows"]) {
        const std::string h = w.value("holder", std::string());
        if (std::find(honest.begin(), honest.end(), h) != honest.end()) seen.insert(h);
      }
    }
    for (const std::string& h : seen) {
      if (m.dump().find(h) == std::string::npos) ++honest_evicted;
    }
    return both;
  });
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  stop = true;
  attack.join();
  EXPECT_TRUE(served) << "after " << took << " s (bound " << bound << " s)";
  EXPECT_EQ(honest_evicted.load(), 0);
  const json m = Map();
  for (const auto& r : m["models"][0]["rings"]) {
    for (const auto& w : r["windows"]) {
      const std::string h = w.value("holder", std::string());
      EXPECT_NE(std::find(honest.begin(), honest.end(), h), honest.end()) << w;
    }
  }
  // Every squatter that got a window lost it at its deadline and now cools down; together they
  // claimed at least as often as the windows they held in turn.
  int claimed = 0;
  for (Squatter& s : sq) {
    if (s.claims == 0) continue;
    ++claimed;
    auto g = s.client->PostSigned("/v1/claims", {{"model", "stories260K"},
                                                 {"ring", 0},
                                                 {"window", 1},
                                                 {"address", "127.0.0.1:9"}});
    EXPECT_EQ(g.status().code(), StatusCode::kForbidden) << g.status().message();
    EXPECT_NE(g.status().message().find("evicted"), std::string::npos) << g.status().message();
  }
  EXPECT_GE(claimed, 6);
  std::printf("sybil: %d of %d squatter keys claimed; both rings served by honest joiners after "
              "%.1f s (bound %.1f s)\n",
              claimed, kSquatters, took, bound);
}

// `kvasir join` over TLS (the market's certificate given with --ca), with a long lease: SIGINT
// releases its claim at once, and it exits 0.
class JoinerTlsTest : public JoinerTest {
 protected:
  double Lease() const override { return 60; }
  bool Tls() const override { return true; }
};

TEST_F(JoinerTlsTest, SigintReleasesTheClaimAndExitsZero) {
  const std::string log = dir_.File("join.log");
  kvasir::testing::ChildProcess join(
      {KVASIR_BINARY, "join", "--market", url_, "--key", dir_.File("node.key"), "--memory",
       "1GiB", "--cache", dir_.File("cache-cli"), "--listen", "127.0.0.1:0", "--ca", cert_,
       "--poll", "0.2", "-t", "1"},
      log);
  ASSERT_TRUE(WaitMap(60, [](const json& m) { return m.dump().find("\"holder\"") != std::string::npos; }))
      << join.log();
  const double lease_left =
      Map()["models"][0]["rings"][0]["windows"][0]["expires_in"].get<double>();
  EXPECT_GT(lease_left, 30);
  const auto t0 = Clock::now();
  join.Signal(SIGINT);
  int status = -1;
  EXPECT_TRUE(WaitFor(30, [&] { return (status = join.Ended()) != -1; })) << join.log();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << join.log();
  // Released, not expired: the window is free while the lease still had most of a minute to run.
  EXPECT_EQ(Map().dump().find("\"holder\""), std::string::npos) << Map().dump();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), lease_left);
  EXPECT_NE(join.log().find("released claim"), std::string::npos) << join.log();
}

}  // namespace
}  // namespace kvasir::market
