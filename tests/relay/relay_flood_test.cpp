// The relay's waiting places under a flood of silent connections: 64 addresses x 16 connections that never
// send a first message (half stop after TCP, half after the WebSocket upgrade), each reopened as
// the relay closes it. New edges of a ring must pair and carry a message within 1 s throughout,
// an edge paired before the flood keeps working, and `kvasir relay` started as documented keeps
// its peak memory within 64 MiB of its idle size and returns to it after.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <vector>

#include "flood.h"
#include "relay/relay_server.h"
#include "server_process.h"
#include "test_assets.h"
#include "ws_test_client.h"

namespace kvasir::relay {
namespace {

using kvasir::testing::ConnectionFlood;
using ws_test::Edge;
using ws_test::kDeadlineMs;
using ws_test::kSecret;
using ws_test::WsClient;
using Clock = std::chrono::steady_clock;

// How far above its idle heap a server may stay after a flood: allocator bookkeeping, not the
// flood's connections (which held about 5 KiB each, 1,024 of them at a time here).
constexpr uint64_t kIdleSlack = uint64_t{1} << 20;

constexpr const char* kUpgrade =
    "GET /edge/flood HTTP/1.1\r\nHost: relay\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";

// 1,024 connections that never say a first message: 32 addresses stop after TCP, 32 after the
// upgrade. Together they are exactly the relay's 1,024 pending places, 16 per address.
struct SilentEdgeFlood {
  explicit SilentEdgeFlood(uint16_t port)
      : tcp({port, ConnectionFlood::LoopbackSources(32, 2), 16, ""}),
        upgraded({port, ConnectionFlood::LoopbackSources(32, 40), 16, kUpgrade}) {}
  int held() const { return tcp.held() + upgraded.held(); }
  uint64_t closed() const { return tcp.closed() + upgraded.closed(); }
  // Waits until each half has had `n` more connections closed by the relay than `since`.
  bool WaitForClosed(std::pair<uint64_t, uint64_t> since, uint64_t n) {
    return tcp.WaitFor([&] { return tcp.closed() >= since.first + n; }, kDeadlineMs) &&
           upgraded.WaitFor([&] { return upgraded.closed() >= since.second + n; }, kDeadlineMs);
  }
  bool WaitForHeld(int each) {
    return tcp.WaitFor([&] { return tcp.held() >= each; }, kDeadlineMs) &&
           upgraded.WaitFor([&] { return upgraded.held() >= each; }, kDeadlineMs);
  }
  void Stop() {
    tcp.Stop();
    upgraded.Stop();
  }
  ConnectionFlood tcp, upgraded;
};

struct EdgeFigures {
  std::vector<double> pair_ms;  // connect both ends, hello, one message across
  std::vector<int> held;        // flood connections open at the start of each round
  int MedianHeld() const {
    std::vector<int> v = held;
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
  }
};

// `rounds` times, once the relay has closed another quarter of the flood (so the rounds spread
// over several turnovers of its connections) and the flood holds its places again: a new edge
// pairs and
// carries a message within 1 s, and the edge paired before the flood still works. With
// `wait_reserved` (in process), the new edge's partner must also join the reserve as expected:
// it is called to wait until the reserve holds n ends.
void PairThroughFlood(uint16_t port, SilentEdgeFlood& flood, Edge& old_edge, int rounds,
                      const std::function<bool(uint64_t)>& wait_reserved, EdgeFigures* out) {
  EdgeFigures& f = *out;
  const std::pair<uint64_t, uint64_t> at_start{flood.tcp.closed(), flood.upgraded.closed()};
  for (int round = 0; round < rounds; ++round) {
    EXPECT_TRUE(flood.WaitForClosed(at_start, 128 * static_cast<uint64_t>(round + 1)))
        << "the relay stopped closing silent connections";
    // The new edge comes when the flood holds the relay's places again, the worst moment for it.
    EXPECT_TRUE(flood.WaitForHeld(500)) << "the flood did not take the places back";
    f.held.push_back(flood.held());
    const std::string id = "ring-" + std::to_string(round);
    const auto start = Clock::now();
    Edge e;
    ASSERT_EQ(e.pred.Connect(port, "/edge/" + id), "");
    ASSERT_EQ(e.pred.Hello(id, Role::kPredecessorSide), "");
    if (wait_reserved) {
      EXPECT_TRUE(wait_reserved(1)) << "the waiting end joins the reserve";
    }
    ASSERT_EQ(e.succ.Connect(port, "/edge/" + id), "");
    if (wait_reserved) {
      EXPECT_TRUE(wait_reserved(2)) << "its partner is expected";
    }
    ASSERT_EQ(e.succ.Hello(id, Role::kSuccessorSide), "");
    ASSERT_EQ(e.pred.Send("token"), "");
    EXPECT_EQ(e.succ.Read(), "token");
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    f.pair_ms.push_back(ms);
    EXPECT_LT(ms, 1000) << "edge " << id << " took " << ms << " ms to pair during the flood";
    old_edge.ExpectWorks();
  }
}

void Print(const char* who, const EdgeFigures& f, const SilentEdgeFlood& flood) {
  std::vector<double> v = f.pair_ms;
  std::sort(v.begin(), v.end());
  if (v.empty()) return;
  std::printf(
      "%s: %zu new edges paired during the flood: median %.1f ms, max %.1f ms; the flood held "
      "%d connections (median of the rounds), %llu closed by the relay and %llu refused\n",
      who, v.size(), v[v.size() / 2], v.back(), f.MedianHeld(),
      static_cast<unsigned long long>(flood.closed()),
      static_cast<unsigned long long>(flood.tcp.refused() + flood.upgraded.refused()));
}

TEST(RelayFloodTest, SilentConnectionsFrom64AddressesLeaveNewEdgesPairedWithinASecond) {
  RelayOptions o;  // the defaults: 1,024 places, 16 per address, a 10 s hello (2 s under pressure)
  o.listen = "127.0.0.1:0";
  o.secret = kSecret;
  auto started = RelayServer::Start(o);
  ASSERT_TRUE(started.ok()) << started.status().message();
  RelayServer& relay = **started;
  Edge old_edge;
  old_edge.Open(relay.port(), "before-the-flood");
  SilentEdgeFlood flood(relay.port());
  ASSERT_TRUE(relay.WaitFor([](const RelayStats& s) { return s.pending >= 1024; }, kDeadlineMs))
      << "the flood never filled the relay's 1,024 places";
  EdgeFigures f;
  PairThroughFlood(
      relay.port(), flood, old_edge, 10,
      [&](uint64_t n) {
        return relay.WaitFor([n](const RelayStats& s) { return s.reserved >= n; }, kDeadlineMs);
      },
      &f);
  Print("relay (in process)", f, flood);
  EXPECT_GT(relay.stats().evicted, 0u) << "no new end needed a place: no test";
  flood.Stop();
  EXPECT_TRUE(relay.WaitFor([](const RelayStats& s) { return s.pending == 0; }, kDeadlineMs));
  EXPECT_EQ(relay.stats().edges_active, 1u);
}

TEST(RelayFloodTest, ARelayStartedAsDocumentedPairsEdgesThroughTheFloodWithinItsMemory) {
  kvasir::testing::TempDir dir;
  const std::string secret_file = dir.File("ring.secret");
  std::ofstream(secret_file) << kSecret;
  kvasir::testing::ServerProcess relay(
      {"relay", "--listen", "127.0.0.1:0", "--secret-file", secret_file, "--log-level", "warn"});
  const std::string line = relay.WaitForLine("relay: listening on", 60000);
  ASSERT_NE(line, "") << relay.output();
  const uint16_t port = kvasir::testing::ServerProcess::PortIn(line);
  ASSERT_NE(port, 0) << line;
  Edge old_edge;
  old_edge.Open(port, "before-the-flood");
  const uint64_t before = relay.StatusBytes("VmRSS"), heap_before = relay.StatusBytes("RssAnon");
  SilentEdgeFlood flood(port);
  ASSERT_TRUE(flood.WaitForHeld(512));
  EdgeFigures f;
  PairThroughFlood(port, flood, old_edge, 10, nullptr, &f);
  Print("kvasir relay", f, flood);
  const uint64_t peak = relay.StatusBytes("VmHWM"), heap_peak = relay.StatusBytes("RssAnon");
  flood.Stop();
  // Back to idle once the flood's connections are gone: its anonymous memory (the heap; pages of
  // the binary it touched for the first time are not memory the flood holds). Each new edge is
  // activity to wait on.
  uint64_t heap_after = relay.StatusBytes("RssAnon");
  const auto deadline = Clock::now() + std::chrono::milliseconds(kDeadlineMs);
  for (int i = 0; heap_after > heap_before + kIdleSlack && Clock::now() < deadline; ++i) {
    Edge e;
    e.Open(port, "after-" + std::to_string(i));
    heap_after = relay.StatusBytes("RssAnon");
  }
  std::printf(
      "kvasir relay memory: %.1f MiB resident before the flood, peak %.1f MiB; heap %.1f "
      "MiB before, %.1f MiB during, %.1f MiB after\n",
      before / 1048576.0, peak / 1048576.0, heap_before / 1048576.0, heap_peak / 1048576.0,
      heap_after / 1048576.0);
  EXPECT_LT(peak, before + (uint64_t{64} << 20));
  EXPECT_LE(heap_after, heap_before + kIdleSlack);
  old_edge.ExpectWorks();
}

}  // namespace
}  // namespace kvasir::relay
