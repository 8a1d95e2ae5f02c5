// The delaying proxy: its timing rules alone (DelaySchedule, TokenBucket), then over loopback
// between a raw client and a raw target. Timings assert lower bounds strictly and upper bounds
// loosely, since the machine may be loaded.
#include "net/delay_proxy.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "net/loopback_socket.h"

namespace kvasir::net {
namespace {

using testing::ConnectLoopback;
using Ms = std::chrono::duration<double, std::milli>;

double MsSince(DelayClock::time_point t0) { return Ms(DelayClock::now() - t0).count(); }

// A listening target on 127.0.0.1 whose connections the test reads and writes as raw sockets.
class Target {
 public:
  Target() : listener_(std::move(Listener::Bind("127.0.0.1", 0)).value()) {}
  std::string address() const { return fmt::format("127.0.0.1:{}", listener_.port()); }
  // The next connection within `ms` (reads on it bounded by `ms` too), or -1.
  int Accept(int ms = 5000) {
    pollfd p{listener_.fd(), POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) return -1;
    const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    timeval tv{ms / 1000, (ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }

 private:
  Listener listener_;
};

// Up to `n` bytes from `fd`, fewer when the peer closes or a read times out.
std::vector<uint8_t> ReadUpTo(int fd, size_t n) {
  std::vector<uint8_t> out(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, out.data() + got, n - got, 0);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

bool WriteAllFd(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Whether the peer of `fd` closed it within the socket's read deadline: a read returns 0, or
// fails with a reset (a socket closed with bytes it had not read yet ends with one).
bool PeerClosed(int fd) {
  uint8_t b;
  const ssize_t n = ::recv(fd, &b, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

struct Rig {
  Target target;
  std::unique_ptr<DelayProxy> proxy;
  int client = -1, server = -1;

  explicit Rig(LinkShape shape, uint64_t max_queued = 1 << 20) {
    DelayProxyOptions o;
    o.target = target.address();
    o.shape = shape;
    o.max_queued_bytes = max_queued;
    auto p = DelayProxy::Start(o);
    EXPECT_TRUE(p.ok()) << p.status().message();
    if (!p.ok()) return;
    proxy = std::move(p).value();
    bool connected = false;
    client = ConnectLoopback(proxy->port(), 5000, &connected);
    EXPECT_TRUE(connected);
    server = target.Accept();
    EXPECT_GE(server, 0) << "the proxy did not dial the target";
  }
  ~Rig() {
    if (client >= 0) ::close(client);
    if (server >= 0) ::close(server);
  }
};

TEST(DelayScheduleTest, ReleasesAreArrivalPlusDelayWithoutJitter) {
  LinkShape s;
  s.delay_ms = 20;
  DelaySchedule d(s, 0);
  const auto t0 = DelayClock::now();
  EXPECT_EQ(d.Release(t0), t0 + std::chrono::milliseconds(20));
  EXPECT_EQ(d.Release(t0 + std::chrono::milliseconds(5)), t0 + std::chrono::milliseconds(25));
}

TEST(DelayScheduleTest, JitterNeverReordersAndIsSeeded) {
  for (JitterShape shape : {JitterShape::kUniform, JitterShape::kNormal}) {
    LinkShape s;
    s.delay_ms = 5;
    s.jitter_ms = 10;  // larger than the delay: many draws would go negative or overtake
    s.jitter_shape = shape;
    DelaySchedule a(s, 7), b(s, 7), c(s, 8);
    const auto t0 = DelayClock::now();
    DelayClock::time_point last = t0;
    bool differs = false;
    for (int i = 0; i < 2000; ++i) {
      const auto arrival = t0 + std::chrono::microseconds(100 * i);
      const auto ra = a.Release(arrival);
      EXPECT_GE(ra, last) << "chunk " << i << " would leave before the one ahead of it";
      EXPECT_GE(ra, arrival) << "chunk " << i << " would leave before it arrived";
      EXPECT_EQ(ra, b.Release(arrival)) << "the same seed must give the same delays";
      differs |= ra != c.Release(arrival);
      last = ra;
    }
    EXPECT_TRUE(differs) << "another seed must give other delays";
  }
}

TEST(TokenBucketTest, SendingAtTheCapTakesTheBytesOverTheRate) {
  const auto t0 = DelayClock::now();
  TokenBucket b(1e6, 10000, t0);  // 1 MB/s, 10 kB burst
  auto now = t0;
  uint64_t left = 1000000;
  while (left > 0) {
    const uint64_t piece = b.Piece(left);
    EXPECT_LE(piece, 10000u);
    now = b.ReadyAt(piece, now);
    b.Take(piece, now);
    left -= piece;
  }
  // The first burst leaves at once, the rest at 1 MB/s: 0.99 s.
  EXPECT_NEAR(Ms(now - t0).count(), 990.0, 1.0);
}

TEST(DelayProxyTest, RefusesBadOptions) {
  DelayProxyOptions o;
  o.target = "no-port";
  EXPECT_FALSE(DelayProxy::Start(o).ok());
  o.target = "127.0.0.1:1";
  o.shape.delay_ms = -1;
  auto r = DelayProxy::Start(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("delay -1"), std::string::npos) << r.status().message();
  o.shape.delay_ms = 0;
  o.max_queued_bytes = 0;
  EXPECT_FALSE(DelayProxy::Start(o).ok());
}

TEST(DelayProxyTest, EachDirectionIsDelayedAtLeastTheOneWayDelay) {
  LinkShape s;
  s.delay_ms = 50;
  Rig rig(s);
  ASSERT_GE(rig.server, 0);
  for (int round = 0; round < 3; ++round) {
    const auto t0 = DelayClock::now();
    ASSERT_TRUE(WriteAllFd(rig.client, "ping", 4));
    ASSERT_EQ(ReadUpTo(rig.server, 4).size(), 4u);
    const double one_way = MsSince(t0);
    ASSERT_TRUE(WriteAllFd(rig.server, "pong", 4));
    ASSERT_EQ(ReadUpTo(rig.client, 4).size(), 4u);
    const double round_trip = MsSince(t0);
    EXPECT_GE(one_way, 50.0);
    EXPECT_GE(round_trip, 100.0);
    EXPECT_LT(round_trip, 100.0 + 2000.0);  // loose: a loaded machine may be slow
  }
  EXPECT_EQ(rig.proxy->Stats().connections, 1u);
  EXPECT_EQ(rig.proxy->Stats().bytes_forwarded, 24u);
}

TEST(DelayProxyTest, JitterKeepsTheBytesInOrder) {
  LinkShape s;
  s.delay_ms = 2;
  s.jitter_ms = 4;
  s.jitter_shape = JitterShape::kNormal;
  Rig rig(s);
  ASSERT_GE(rig.server, 0);
  constexpr uint32_t kCount = 20000;
  std::thread writer([&] {
    for (uint32_t i = 0; i < kCount; i += 50) {
      uint32_t block[50];
      for (uint32_t j = 0; j < 50; ++j) block[j] = i + j;
      if (!WriteAllFd(rig.client, block, sizeof(block))) return;
      if (i % 1000 == 0) std::this_thread::yield();
    }
  });
  const std::vector<uint8_t> got = ReadUpTo(rig.server, kCount * 4);
  writer.join();
  ASSERT_EQ(got.size(), kCount * 4);
  for (uint32_t i = 0; i < kCount; ++i) {
    uint32_t v;
    std::memcpy(&v, got.data() + 4 * i, 4);
    ASSERT_EQ(v, i) << "byte order changed at value " << i;
  }
}

TEST(DelayProxyTest, BandwidthCapHoldsBytesToTheRate) {
  LinkShape s;
  s.bytes_per_s = 1e6;  // 8 Mbit/s
  s.burst_bytes = 16384;
  Rig rig(s);
  ASSERT_GE(rig.server, 0);
  std::vector<uint8_t> data(400000, 0x5A);
  const auto t0 = DelayClock::now();
  std::thread writer([&] { WriteAllFd(rig.client, data.data(), data.size()); });
  const std::vector<uint8_t> got = ReadUpTo(rig.server, data.size());
  const double ms = MsSince(t0);
  writer.join();
  ASSERT_EQ(got, data);
  EXPECT_GE(ms, (400000.0 - 16384.0) / 1e6 * 1000.0);
  EXPECT_LT(ms, 10000.0);
}

TEST(DelayProxyTest, AFullQueueStopsReadingSoMemoryStaysBounded) {
  constexpr uint64_t kMaxQueued = 64 * 1024;
  LinkShape s;
  s.delay_ms = 1;
  Rig rig(s, kMaxQueued);
  ASSERT_GE(rig.server, 0);
  // The target reads nothing: the client writes until no byte has gone out for 300 ms.
  const int flags = fcntl(rig.client, F_GETFL);
  fcntl(rig.client, F_SETFL, flags | O_NONBLOCK);
  std::vector<uint8_t> block(4096);
  uint64_t written = 0;
  while (written < (256u << 20)) {
    for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<uint8_t>((written + i) % 251);
    const ssize_t w = ::send(rig.client, block.data(), block.size(), MSG_NOSIGNAL);
    if (w > 0) {
      written += static_cast<uint64_t>(w);
      continue;
    }
    ASSERT_TRUE(w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) << std::strerror(errno);
    pollfd p{rig.client, POLLOUT, 0};
    if (::poll(&p, 1, 300) == 0) break;
  }
  ASSERT_LT(written, 256u << 20)
      << "the proxy kept reading from a client whose target reads nothing";
  EXPECT_LE(rig.proxy->Stats().peak_queued_bytes, kMaxQueued + 64 * 1024);
  EXPECT_GT(rig.proxy->Stats().peak_queued_bytes, 0u);
  // Every byte still arrives, in order, once the target reads.
  fcntl(rig.client, F_SETFL, flags);
  const std::vector<uint8_t> got = ReadUpTo(rig.server, written);
  ASSERT_EQ(got.size(), written);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], static_cast<uint8_t>(i % 251)) << "at byte " << i;
  }
}

TEST(DelayProxyTest, TheClientClosingEndsTheTargetsSideAfterTheQueuedBytes) {
  LinkShape s;
  s.delay_ms = 30;
  Rig rig(s);
  ASSERT_GE(rig.server, 0);
  ASSERT_TRUE(WriteAllFd(rig.client, "last words", 10));
  ::close(rig.client);
  rig.client = -1;
  EXPECT_EQ(ReadUpTo(rig.server, 10).size(), 10u) << "queued bytes must be delivered first";
  EXPECT_TRUE(PeerClosed(rig.server));
}

TEST(DelayProxyTest, TheTargetClosingEndsTheClientsSide) {
  LinkShape s;
  s.delay_ms = 30;
  Rig rig(s);
  ASSERT_GE(rig.server, 0);
  ASSERT_TRUE(WriteAllFd(rig.server, "bye", 3));
  ::close(rig.server);
  rig.server = -1;
  EXPECT_EQ(ReadUpTo(rig.client, 3).size(), 3u);
  EXPECT_TRUE(PeerClosed(rig.client));
}

TEST(DelayProxyTest, ATargetThatIsDownDropsTheConnectionAndTheProxyStaysUp) {
  uint16_t dead_port = 0;
  {
    auto gone = Listener::Bind("127.0.0.1", 0);
    ASSERT_TRUE(gone.ok());
    dead_port = gone->port();
  }  // closed: dialling it is refused
  DelayProxyOptions o;
  o.target = fmt::format("127.0.0.1:{}", dead_port);
  o.shape.delay_ms = 5;
  auto proxy = DelayProxy::Start(o);
  ASSERT_TRUE(proxy.ok()) << proxy.status().message();
  for (int i = 0; i < 2; ++i) {
    bool connected = false;
    const int fd = ConnectLoopback((*proxy)->port(), 5000, &connected);
    EXPECT_TRUE(connected) << "attempt " << i;
    EXPECT_TRUE(PeerClosed(fd)) << "attempt " << i;
    ::close(fd);
  }
  EXPECT_EQ((*proxy)->Stats().connections, 0u);
}

TEST(DelayProxyTest, StopEndsLiveConnectionsAndRefusesNewOnes) {
  LinkShape s;
  s.delay_ms = 1000;
  Rig rig(s);
  ASSERT_GE(rig.server, 0);
  ASSERT_TRUE(WriteAllFd(rig.client, "never delivered", 15));
  const uint16_t port = rig.proxy->port();
  const auto t0 = DelayClock::now();
  rig.proxy->Stop();
  EXPECT_LT(MsSince(t0), 1000.0) << "Stop() must not wait for queued bytes";
  EXPECT_TRUE(PeerClosed(rig.client));
  EXPECT_TRUE(PeerClosed(rig.server));
  bool connected = false;
  const int again = ConnectLoopback(port, 1000, &connected);
  ::close(again);
  EXPECT_FALSE(connected);
}

}  // namespace
}  // namespace kvasir::net
