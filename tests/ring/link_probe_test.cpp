// Link probe on loopback: a real server measures a small positive RTT and a positive bandwidth;
// peers that are not probe servers or clients (garbage, silence, another version, a ring stage, a
// wrong answer) are refused with a message naming them, within the timeout.
#include "ring/link_probe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "net/stream.h"
#include "ring/wire.h"

namespace kvasir::ring {
namespace {

using ::testing::HasSubstr;

constexpr int kShortTimeoutMs = 300;

std::span<const uint8_t> AsBytes(const std::string &s) {
  return {reinterpret_cast<const uint8_t *>(s.data()), s.size()};
}

// Reads exactly n bytes (or until the stream ends); returns what it got.
std::vector<uint8_t> ReadN(net::Stream &s, size_t n) {
  std::vector<uint8_t> out(n);
  size_t done = 0;
  while (done < n) {
    auto r = s.ReadSome({out.data() + done, n - done});
    if (!r.ok() || *r == 0) break;
    done += *r;
  }
  out.resize(done);
  return out;
}

// A one-connection fake peer on 127.0.0.1: `behave` gets the accepted stream in a thread.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(net::Stream &)> behave) {
    auto l = net::Listener::Bind("127.0.0.1", 0);
    EXPECT_TRUE(l.ok()) << l.status().message();
    listener_ = std::make_unique<net::Listener>(std::move(*l));
    thread_ = std::thread([this, behave = std::move(behave)] {
      auto c = listener_->Accept();
      accepted_ = true;
      if (c.ok()) behave(**c);
    });
  }
  ~FakeServer() {
    // Close() only to wake an Accept() that never got its connection (a failed test).
    if (accepted_) thread_.join();
    listener_->Close();
    if (thread_.joinable()) thread_.join();
  }
  uint16_t port() const { return listener_->port(); }

 private:
  std::unique_ptr<net::Listener> listener_;
  std::atomic<bool> accepted_{false};
  std::thread thread_;
};

LinkProbeOptions Fast(uint64_t bytes = 4 << 20) {
  LinkProbeOptions o;
  o.pings = 20;
  o.bytes = bytes;
  o.io_timeout_ms = kShortTimeoutMs;
  return o;
}

std::string ProbeError(uint16_t port, const LinkProbeOptions &o = Fast()) {
  auto m = ProbeLink("127.0.0.1", port, o);
  return m.ok() ? "(probe succeeded)" : m.status().message();
}

TEST(LinkProbe, LoopbackMeasuresRttAndBandwidth) {
  auto server = LinkProbeServer::Bind("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().message();
  Result<LinkProbeSessionStats> served = Error("not served");
  std::thread t([&] { served = (*server)->Serve(/*once=*/true); });
  LinkProbeOptions o;  // 50 pings, as `kvasir profile --link` does
  o.bytes = 16 << 20;
  auto m = ProbeLink("127.0.0.1", (*server)->port(), o);
  t.join();
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_TRUE(served.ok()) << served.status().message();
  EXPECT_EQ(m->pings, 50);
  EXPECT_GT(m->rtt_ms, 0.0);
  EXPECT_LT(m->rtt_ms, 20.0);  // loopback: tens of microseconds, with room for a loaded machine
  EXPECT_LE(m->rtt_min_ms, m->rtt_ms);
  EXPECT_LE(m->rtt_ms, m->rtt_max_ms);
  EXPECT_EQ(m->bytes, uint64_t{16} << 20);
  EXPECT_GT(m->transfer_ms, 0.0);
  EXPECT_GT(m->bandwidth_mbps, 0.0);
  EXPECT_EQ(served->pings, 51);  // one warm-up ping, untimed
  EXPECT_EQ(served->bytes, uint64_t{16} << 20);
  std::printf("loopback: rtt %.4f ms (min %.4f, max %.4f), %.1f Mbit/s (16 MiB in %.2f ms)\n",
              m->rtt_ms, m->rtt_min_ms, m->rtt_max_ms, m->bandwidth_mbps, m->transfer_ms);
}

TEST(LinkProbe, GarbageServerIsRefused) {
  FakeServer fake([](net::Stream &s) {
    (void)s.WriteAll(AsBytes("HTTP/1.1 400 Bad Request\r\n\r\n"));
    ReadN(s, 1 << 20);  // until the client hangs up
  });
  EXPECT_THAT(ProbeError(fake.port()),
              HasSubstr(":" + std::to_string(fake.port()) +
                        ": is not a kvasir link probe server (it sent 48 54 54 50 2f 31 2e 31)"));
}

TEST(LinkProbe, ShortGarbageThenCloseIsRefused) {
  FakeServer fake([](net::Stream &s) { (void)s.WriteAll(AsBytes("no\n")); });
  EXPECT_THAT(ProbeError(fake.port()),
              HasSubstr("is not a kvasir link probe server (it sent 6e 6f 0a)"));
}

TEST(LinkProbe, SilentServerTimesOut) {
  FakeServer fake([](net::Stream &s) { ReadN(s, 1 << 20); });
  EXPECT_THAT(ProbeError(fake.port()),
              HasSubstr("timed out after 300 ms waiting for the server's hello (is it a `kvasir "
                        "profile --link-serve` port?)"));
}

TEST(LinkProbe, ServerThatHangsUpIsNamed) {
  FakeServer fake([](net::Stream &s) { ReadN(s, 8); });
  EXPECT_THAT(ProbeError(fake.port()),
              HasSubstr("closed the connection while this side waited for the server's hello"));
}

TEST(LinkProbe, RingStagePortIsNamed) {
  FakeServer fake([](net::Stream &s) {
    wire::FrameHeader h{wire::kMagic, 1, 0, 0, 0};
    (void)s.WriteAll({reinterpret_cast<const uint8_t *>(&h), sizeof(h)});
    ReadN(s, 1 << 20);
  });
  EXPECT_THAT(ProbeError(fake.port()),
              HasSubstr("is a kvasir ring stage, not a link probe server"));
}

TEST(LinkProbe, OtherServerVersionIsRefused) {
  FakeServer fake([](net::Stream &s) {
    ReadN(s, 8);
    const uint8_t hello[8] = {'K', 'V', 'L', 'P', 2, 0, 0, 0};
    (void)s.WriteAll(hello);
    ReadN(s, 1 << 20);
  });
  EXPECT_THAT(ProbeError(fake.port()),
              HasSubstr("link probe server speaks version 2, this build speaks 1"));
}

TEST(LinkProbe, WrongPongIsRefused) {
  FakeServer fake([](net::Stream &s) {
    ReadN(s, 8);
    const uint8_t hello[8] = {'K', 'V', 'L', 'P', 1, 0, 0, 0};
    (void)s.WriteAll(hello);
    ReadN(s, 16);
    const uint64_t pong[2] = {2, 7};  // type pong, sequence 7
    (void)s.WriteAll({reinterpret_cast<const uint8_t *>(pong), sizeof(pong)});
    ReadN(s, 1 << 20);
  });
  EXPECT_THAT(ProbeError(fake.port()), HasSubstr("answered ping 0 with pong 7 (expected pong 0)"));
}

TEST(LinkProbe, ServerRefusesGarbageAndServesTheNextClient) {
  auto server = LinkProbeServer::Bind("127.0.0.1", 0, kShortTimeoutMs);
  ASSERT_TRUE(server.ok()) << server.status().message();
  std::vector<std::string> sessions;
  Result<LinkProbeSessionStats> served = Error("not served");
  std::thread t([&] {
    served = (*server)->Serve(/*once=*/true, [&](const Result<LinkProbeSessionStats> &r) {
      sessions.push_back(r.ok() ? "ok" : r.status().message());
    });
  });
  {
    auto c = net::DialTcp("127.0.0.1", (*server)->port(), 2000);
    ASSERT_TRUE(c.ok()) << c.status().message();
    ASSERT_TRUE((*c)->WriteAll(AsBytes("GET / HTTP/1.1\r\n\r\n")).ok());
    EXPECT_TRUE(ReadN(**c, 64).empty());  // refused: closed without an answer
  }
  auto m = ProbeLink("127.0.0.1", (*server)->port(), Fast());
  t.join();
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_TRUE(served.ok()) << served.status().message();
  ASSERT_EQ(sessions.size(), 2u);
  EXPECT_THAT(sessions[0],
              HasSubstr("is not a kvasir link probe client (it sent 47 45 54 20 2f 20 48 54)"));
  EXPECT_EQ(sessions[1], "ok");
}

TEST(LinkProbe, ServerAnswersAnOtherVersionClientThenRefusesIt) {
  auto l = net::Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(l.ok());
  Result<LinkProbeSessionStats> served = Error("not served");
  std::thread t([&] {
    auto c = l->Accept();
    if (c.ok()) served = ServeLinkProbeSession(**c, kShortTimeoutMs);
  });
  auto c = net::DialTcp("127.0.0.1", l->port(), 2000);
  ASSERT_TRUE(c.ok());
  const uint8_t hello[8] = {'K', 'V', 'L', 'P', 9, 0, 0, 0};
  ASSERT_TRUE((*c)->WriteAll(hello).ok());
  const std::vector<uint8_t> answer = ReadN(**c, 8);
  t.join();
  EXPECT_EQ(answer, (std::vector<uint8_t>{'K', 'V', 'L', 'P', 1, 0, 0, 0}));
  ASSERT_FALSE(served.ok());
  EXPECT_THAT(served.status().message(),
              HasSubstr("link probe client speaks version 9, this build speaks 1"));
}

TEST(LinkProbe, SilentClientTimesOutOnTheServer) {
  auto l = net::Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(l.ok());
  Result<LinkProbeSessionStats> served = Error("not served");
  std::thread t([&] {
    auto c = l->Accept();
    if (c.ok()) served = ServeLinkProbeSession(**c, kShortTimeoutMs);
  });
  auto c = net::DialTcp("127.0.0.1", l->port(), 2000);
  ASSERT_TRUE(c.ok());
  const uint8_t hello[8] = {'K', 'V', 'L', 'P', 1, 0, 0, 0};
  ASSERT_TRUE((*c)->WriteAll(hello).ok());
  t.join();  // the server gives up on its own
  ASSERT_FALSE(served.ok());
  EXPECT_THAT(served.status().message(),
              HasSubstr("timed out after 300 ms waiting for the next message"));
}

TEST(LinkProbe, StopEndsServe) {
  auto server = LinkProbeServer::Bind("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  Result<LinkProbeSessionStats> served = Error("not served");
  std::thread t([&] { served = (*server)->Serve(/*once=*/false); });
  ASSERT_TRUE(ProbeLink("127.0.0.1", (*server)->port(), Fast(64 << 10)).ok());
  ASSERT_TRUE(ProbeLink("127.0.0.1", (*server)->port(), Fast(64 << 10)).ok());
  (*server)->Stop();
  t.join();
  EXPECT_TRUE(served.ok()) << served.status().message();
}

TEST(LinkProbe, RefusesBadOptions) {
  auto server = LinkProbeServer::Bind("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  LinkProbeOptions o = Fast();
  o.pings = 0;
  EXPECT_THAT(ProbeError((*server)->port(), o), HasSubstr("pings must be >= 1 (got 0)"));
}

}  // namespace
}  // namespace kvasir::ring
