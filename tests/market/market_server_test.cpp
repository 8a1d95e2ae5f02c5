// The market over real HTTP: racing claimers, body and header limits, slow and silent clients,
// the client library against the server, and a flood of silent connections (in
// process, and against `kvasir market` started as documented, with its memory).
#include "market/market_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "flood.h"
#include "market/market_client.h"
#include "market/signed_request.h"
#include "market_test_util.h"
#include "net/stream.h"
#include "raw_client.h"
#include "server_process.h"
#include "test_assets.h"

namespace kvasir::market {
namespace {

using kvasir::testing::ConnectionFlood;
using kvasir::testing::KeyN;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Every wait below ends on its event; this deadline only stops a broken server from hanging a test.
constexpr int kDeadlineMs = 10000;

// How far above its idle heap the market may stay after a flood: allocator bookkeeping, not the
// flood's connections.
constexpr uint64_t kIdleSlack = uint64_t{1} << 20;

// Clients wait up to 5 s, so an answer slower than the 1 s the tests demand is measured, not lost.
MarketClient PatientClient(const std::string& url, std::shared_ptr<const ring::NodeKey> key) {
  net::HttpRequestOptions http;
  http.timeout_ms = 5000;
  auto c = MarketClient::Create(url, std::move(key), http);
  EXPECT_TRUE(c.ok());
  return std::move(c).value();
}

// A flood: 522 connections (58 from each of nine addresses) that never send a
// byte, each reopened as soon as the market closes or refuses it.
// Flood connections open when the market's 512 places are all the flood's (the other 10 are being
// refused and reopened).
constexpr int kFloodFull = 505;

testing::FloodOptions SilentFlood(uint16_t port) {
  return {port, ConnectionFlood::LoopbackSources(9), 58, ""};
}

struct FloodFigures {
  std::vector<double> latency_ms;  // every honest request
  std::vector<int> held;           // flood connections open at the start of each round
  int MedianHeld() const {
    std::vector<int> v = held;
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
  }
  double silent_closed_ms = 0;  // a silent connection of our own, from its connect to its close
};

// Honest traffic during the flood: `rounds` times, once the market has closed another quarter of
// the flood's connections (so the rounds spread over several turnovers) and the flood holds the
// market's 512 places again, a client from 127.0.0.1 reads /health and /v1/map and a node
// heartbeats its claim. Every answer must be a 200 within 1 s.
FloodFigures ServeThroughFlood(const std::string& url, int64_t claim,
                               std::shared_ptr<const ring::NodeKey> key, ConnectionFlood& flood,
                               uint16_t port, int rounds) {
  FloodFigures f;
  MarketClient reader = PatientClient(url, nullptr);
  MarketClient node = PatientClient(url, std::move(key));
  auto timed = [&](const char* what, const std::function<Result<json>()>& call) {
    const auto start = Clock::now();
    const Result<json> r = call();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    f.latency_ms.push_back(ms);
    EXPECT_TRUE(r.ok()) << what << ": " << r.status().message();
    EXPECT_LT(ms, 1000) << what << " took " << ms << " ms during the flood";
  };
  const uint64_t closed_at_start = flood.closed();
  for (int round = 0; round < rounds; ++round) {
    const uint64_t want = closed_at_start + 130 * static_cast<uint64_t>(round + 1);
    EXPECT_TRUE(flood.WaitFor([&] { return flood.closed() >= want; }, kDeadlineMs))
        << "the market stopped closing silent connections";
    // The honest requests go when the flood holds the table again, the worst moment for them.
    EXPECT_TRUE(flood.WaitFor([&] { return flood.held() >= kFloodFull; }, kDeadlineMs))
        << "the flood did not take the places back";
    f.held.push_back(flood.held());
    timed("GET /health", [&] { return reader.Get("/health"); });
    timed("GET /v1/map", [&] { return reader.Get("/v1/map"); });
    timed("heartbeat", [&] {
      return node.PostSigned("/v1/heartbeat", {{"claim", claim}, {"serving_epoch", -1}});
    });
  }
  // One more silent connection, from an address of its own: closed within a second or two.
  const auto start = Clock::now();
  testing::RawClient silent(port, "127.0.1.1");
  EXPECT_TRUE(silent.ClosedByServer());
  f.silent_closed_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  EXPECT_LT(f.silent_closed_ms, 2500);
  return f;
}

void PrintFigures(const char* who, const FloodFigures& f, const ConnectionFlood& flood) {
  std::vector<double> v = f.latency_ms;
  std::sort(v.begin(), v.end());
  if (v.empty()) return;
  std::printf(
      "%s: %zu honest requests during the flood: median %.1f ms, max %.1f ms; the flood held %d "
      "connections (median of the rounds), %llu closed by the market and %llu refused; a silent "
      "connection closed after %.0f ms\n",
      who, v.size(), v[v.size() / 2], v.back(), f.MedianHeld(),
      static_cast<unsigned long long>(flood.closed()),
      static_cast<unsigned long long>(flood.refused()), f.silent_closed_ms);
}

int64_t ClaimWindow(const MarketClient& node) {
  auto grant = node.PostSigned(
      "/v1/claims", {{"model", "tiny"}, {"ring", 0}, {"window", 0}, {"address", ":7001"}});
  EXPECT_TRUE(grant.ok()) << grant.status().message();
  return grant.ok() ? (*grant)["claim"].get<int64_t>() : 0;
}

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
  // Serves the same API with other options (the flood tests use the defaults: 10 s for a request,
  // 30 s idle, so a close within a second or two shows the pressed deadlines at work).
  void Restart(MarketServerOptions o) {
    server_->Stop();
    o.listen = "127.0.0.1:0";
    auto srv = MarketServer::Start(o, api_.get());
    ASSERT_TRUE(srv.ok()) << srv.status().message();
    server_ = std::move(srv).value();
    url_ = "http://127.0.0.1:" + std::to_string(server_->port());
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
    (void)(*s)->WriteAll(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
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
      if (r.ok())
        ++won;
      else if (r.status().code() == StatusCode::kConflict)
        ++lost;
      else
        ++other;
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
  const std::string reply =
      Raw("POST /v1/receipts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          "Content-Length: 2000000000\r\n\r\n{");
  EXPECT_NE(reply.find("HTTP/1.1 413"), std::string::npos) << reply;
  EXPECT_NE(reply.find("too_large"), std::string::npos);
  // Chunked, without a length: cut at the limit.
  std::string chunked =
      "POST /v1/receipts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string piece(64 * 1024, 'a');
  for (int i = 0; i < 17; ++i) chunked += "10000\r\n" + piece + "\r\n";
  EXPECT_NE(Raw(chunked).find("HTTP/1.1 413"), std::string::npos);
  std::string big_header =
      "GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(9000, 'p') + "\r\n\r\n";
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

TEST_F(MarketServerTest, ASilentFloodFromNineAddressesLeavesClientsAndHeartbeatsServed) {
  Restart(MarketServerOptions{});
  auto key = std::make_shared<const ring::NodeKey>(KeyN(7));
  const int64_t claim = ClaimWindow(Client(key));
  ConnectionFlood flood(SilentFlood(server_->port()));
  ASSERT_TRUE(
      server_->WaitFor([](const MarketServerStats& s) { return s.open >= 512; }, kDeadlineMs))
      << "the flood never filled the market's 512 places";
  const FloodFigures f = ServeThroughFlood(url_, claim, key, flood, server_->port(), 12);
  PrintFigures("market (in process)", f, flood);
  EXPECT_GT(server_->stats().evicted, 0u) << "no honest connection needed a place: no test";
  flood.Stop();
  // Once the flood is gone every place is free again.
  EXPECT_TRUE(server_->WaitFor(
      [](const MarketServerStats& s) { return s.open == 0 && s.proven == 0; }, kDeadlineMs));
}

// A signed request moves its kept-alive connection to the proven pool: a flood of strangers that
// fills the open pool (and shortens its deadlines) neither evicts nor times it out.
TEST_F(MarketServerTest, AConnectionThatSentASignedRequestKeepsItsPlaceThroughTheFlood) {
  Restart(MarketServerOptions{});
  auto key = std::make_shared<const ring::NodeKey>(KeyN(8));
  const int64_t claim = ClaimWindow(Client(key));
  const std::string body = json{{"claim", claim}, {"serving_epoch", -1}}.dump();
  auto heartbeat = [&] {
    std::string req =
        "POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
    for (const auto& [name, value] :
         SignRequest(*key, "POST", "/v1/heartbeat", body, static_cast<int64_t>(UnixNow()))) {
      req += name + ": " + value + "\r\n";
    }
    return req + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  testing::RawClient node(server_->port());
  node.Send(heartbeat());
  ASSERT_THAT(node.ReadResponse(), ::testing::StartsWith("HTTP/1.1 200"));
  ASSERT_TRUE(
      server_->WaitFor([](const MarketServerStats& s) { return s.proven == 1; }, kDeadlineMs));
  ConnectionFlood flood(SilentFlood(server_->port()));
  // Several turns of the flood (each silent connection lives a second under this pressure), where
  // an idle connection in the open pool would get a second too.
  ASSERT_TRUE(
      server_->WaitFor([](const MarketServerStats& s) { return s.open >= 512; }, kDeadlineMs));
  const uint64_t closed = flood.closed();
  ASSERT_TRUE(flood.WaitFor([&] { return flood.closed() >= closed + 1000; }, kDeadlineMs));
  node.Send(heartbeat());
  EXPECT_THAT(node.ReadResponse(), ::testing::StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(server_->stats().proven, 1u);
}

// A flood whose every connection sends one heartbeat with a forged signature (signed over another
// body), then falls silent: each costs the signature threads a check and their queue a place, and
// none may earn its connection the proven pool; honest heartbeats and reads are still answered
// within a second, as in the silent flood.
TEST_F(MarketServerTest, AFloodOfForgedSignaturesLeavesClientsAndHeartbeatsServed) {
  Restart(MarketServerOptions{});
  auto key = std::make_shared<const ring::NodeKey>(KeyN(7));
  const int64_t claim = ClaimWindow(Client(key));
  const ring::NodeKey forger = KeyN(9);
  const std::string body = json{{"claim", claim}, {"serving_epoch", -1}}.dump();
  std::string forged =
      "POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  for (const auto& [name, value] :
       SignRequest(forger, "POST", "/v1/heartbeat", body + " ", static_cast<int64_t>(UnixNow()))) {
    forged += name + ": " + value + "\r\n";
  }
  forged += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  {
    // The flood's bytes are a whole request whose signature is checked and refused.
    testing::RawClient probe(server_->port());
    probe.Send(forged);
    ASSERT_THAT(probe.ReadResponse(), ::testing::StartsWith("HTTP/1.1 401"));
  }
  testing::FloodOptions o = SilentFlood(server_->port());
  o.first_bytes = forged;
  ConnectionFlood flood(o);
  ASSERT_TRUE(
      server_->WaitFor([](const MarketServerStats& s) { return s.open >= 512; }, kDeadlineMs))
      << "the flood never filled the market's 512 places";
  const FloodFigures f = ServeThroughFlood(url_, claim, key, flood, server_->port(), 6);
  PrintFigures("market (forged signatures)", f, flood);
  // Only the honest node's connections ever sent a signature that verified.
  EXPECT_LE(server_->stats().proven, 2u);
  flood.Stop();
  EXPECT_TRUE(server_->WaitFor(
      [](const MarketServerStats& s) { return s.open == 0 && s.proven == 0; }, kDeadlineMs));
}

// The flood against `kvasir market` started the documented way, with the process's memory: its
// peak (VmHWM) stays within 64 MiB of what it held before, and its resident memory returns after.
TEST(MarketProcessTest, AMarketUnderASilentFloodServesWithinASecondAndItsMemory) {
  kvasir::testing::TempDir dir;
  const std::string db = dir.File("market.sqlite");
  {
    auto store = Store::Open(db);
    ASSERT_TRUE(store.ok()) << store.status().message();
    ASSERT_TRUE((*store)->AddModel(kvasir::testing::TestModel(), false, UnixNow()).ok());
  }
  testing::ServerProcess market(
      {"market", "--db", db, "--listen", "127.0.0.1:0", "--log-level", "warn"});
  const std::string line = market.WaitForLine("market: listening on", 60000);
  ASSERT_NE(line, "") << market.output();
  const uint16_t port = testing::ServerProcess::PortIn(line);
  ASSERT_NE(port, 0) << line;
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  auto key = std::make_shared<const ring::NodeKey>(KeyN(9));
  const int64_t claim = ClaimWindow(PatientClient(url, key));
  ASSERT_TRUE(PatientClient(url, nullptr).Get("/v1/map").ok());
  const uint64_t before = market.StatusBytes("VmRSS"), heap_before = market.StatusBytes("RssAnon");
  ConnectionFlood flood(SilentFlood(port));
  ASSERT_TRUE(flood.WaitFor([&] { return flood.held() >= 512; }, kDeadlineMs));
  const FloodFigures f = ServeThroughFlood(url, claim, key, flood, port, 12);
  PrintFigures("kvasir market", f, flood);
  const uint64_t peak = market.StatusBytes("VmHWM"), heap_peak = market.StatusBytes("RssAnon");
  flood.Stop();
  // Back to idle: the heap (anonymous memory) returns once the connections are gone; pages of the
  // binary touched for the first time are not memory the flood holds. Each request is activity to
  // wait on.
  uint64_t heap_after = market.StatusBytes("RssAnon");
  const auto deadline = Clock::now() + std::chrono::milliseconds(kDeadlineMs);
  while (heap_after > heap_before + kIdleSlack && Clock::now() < deadline) {
    ASSERT_TRUE(PatientClient(url, nullptr).Get("/health").ok());
    heap_after = market.StatusBytes("RssAnon");
  }
  std::printf(
      "kvasir market memory: %.1f MiB resident before the flood, peak %.1f MiB; heap %.1f "
      "MiB before, %.1f MiB during, %.1f MiB after\n",
      before / 1048576.0, peak / 1048576.0, heap_before / 1048576.0, heap_peak / 1048576.0,
      heap_after / 1048576.0);
  EXPECT_LT(peak, before + (uint64_t{64} << 20));
  EXPECT_LE(heap_after, heap_before + kIdleSlack);
}

}  // namespace
}  // namespace kvasir::market
