// The relay server against raw WebSocket clients: pairing and bridging, and every refusal of
// docs/RELAY.md (wrong token, bad preamble, a taken role, an oversized message, a silent client, a
// missing partner, too many pending connections, bad paths) without disturbing an established edge;
// an unauthenticated peer cannot make the relay buffer a large message. Every wait is on an event
// (a reply, or a change of the relay's counters through RelayServer::WaitFor) with a generous
// deadline; nothing sleeps or polls.
#include "relay/relay_server.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <thread>
#include <utility>

#include "raw_client.h"
#include "relay/edge_token.h"
#include "test_assets.h"
#include "ws_test_client.h"

namespace kvasir::relay {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace websocket = boost::beast::websocket;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

using ws_test::Bytes;
using ws_test::Client;
using ws_test::Edge;
using ws_test::kDeadlineMs;
using ws_test::kSecret;
using ws_test::WsClient;

RelayOptions Fast() {
  RelayOptions o;
  o.listen = "127.0.0.1:0";
  o.secret = kSecret;
  o.hello_timeout_ms = 400;
  o.pair_timeout_ms = 600;
  o.idle_timeout_ms = 5000;
  o.max_message_bytes = 1 << 20;
  return o;
}

std::unique_ptr<RelayServer> StartRelay(const RelayOptions& o) {
  auto r = RelayServer::Start(o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Waits on the relay's own events (no polling) until `done` holds of its counters.
bool WaitFor(const RelayServer& relay, const std::function<bool(const RelayStats&)>& done) {
  return relay.WaitFor(done, kDeadlineMs);
}

// A TCP connection to the relay whose reads give up after kDeadlineMs.
std::unique_ptr<tcp::iostream> Raw(uint16_t port) {
  auto s = std::make_unique<tcp::iostream>();
  s->expires_after(std::chrono::milliseconds(kDeadlineMs));
  s->connect("127.0.0.1", std::to_string(port));
  return s;
}

// A field of this process's /proc/self/status in bytes: "VmRSS" (resident now), "VmHWM" (peak).
uint64_t StatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  ADD_FAILURE() << "no " << field << " in /proc/self/status";
  return 0;
}

// A WebSocket client written with plain sockets, so it can send what a real client library never
// would: a frame header announcing a huge message, then its payload, without holding it in memory.
class RawWsClient {
 public:
  explicit RawWsClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{kDeadlineMs / 1000, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~RawWsClient() { ::close(fd_); }

  // Sends the upgrade request for `path` and reads the response head. Returns its status line.
  std::string Upgrade(const std::string& path) {
    if (!connected_) return "not connected";
    const std::string req = "GET " + path +
                            " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
                            "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    if (!SendAll(req.data(), req.size())) return "send failed";
    std::string head;
    char c;
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 4096) {
      if (::recv(fd_, &c, 1, 0) != 1) break;
      head.push_back(c);
    }
    return head.substr(0, head.find("\r\n"));
  }
  // A masked (all-zero mask) binary frame header announcing `len` payload bytes, then `len` zero
  // bytes from one small buffer. Returns how many payload bytes went out before the relay stopped
  // taking them.
  uint64_t SendHugeMessage(uint64_t len) {
    uint8_t h[14] = {0x82, 0x80 | 127};
    for (int i = 0; i < 8; ++i) h[2 + i] = static_cast<uint8_t>(len >> (56 - 8 * i));
    if (!SendAll(h, sizeof(h))) return 0;
    static const std::string kZeros(256 * 1024, '\0');
    uint64_t sent = 0;
    while (sent < len) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kZeros.size(), len - sent));
      if (!SendAll(kZeros.data(), n)) break;
      sent += n;
    }
    return sent;
  }
  // Reads frames until a close frame; returns its code (0: the connection ended without one).
  int ReadCloseCode() {
    while (true) {
      uint8_t h[2];
      if (!RecvAll(h, 2)) return 0;
      uint64_t len = h[1] & 0x7f;
      if (len == 126 || len == 127) {
        uint8_t ext[8];
        const int n = len == 126 ? 2 : 8;
        if (!RecvAll(ext, n)) return 0;
        len = 0;
        for (int i = 0; i < n; ++i) len = (len << 8) | ext[i];
      }
      std::string payload(static_cast<size_t>(std::min<uint64_t>(len, 1 << 20)), '\0');
      if (len > payload.size() || !RecvAll(payload.data(), payload.size())) return 0;
      if ((h[0] & 0x0f) == 0x8) {
        return payload.size() >= 2
                   ? (static_cast<uint8_t>(payload[0]) << 8) | static_cast<uint8_t>(payload[1])
                   : 1005;
      }
    }
  }

 private:
  bool SendAll(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t k = ::send(fd_, c, n, MSG_NOSIGNAL);
      if (k <= 0) return false;
      c += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }
  bool RecvAll(void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t k = ::recv(fd_, c, n, 0);
      if (k <= 0) return false;
      c += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }
  int fd_ = -1;
  bool connected_ = false;
};

TEST(RelayServerTest, PairsTheEndsOfAnEdgeAndBridgesBothWays) {
  auto relay = StartRelay(Fast());
  Edge e;
  e.Open(relay->port(), "ring1-r0-r1");
  const std::string big(900 * 1024, 'x');
  ASSERT_EQ(e.pred.Send(big), "");
  EXPECT_EQ(e.succ.Read(), big);
  // Messages keep their order and their boundaries.
  for (int i = 0; i < 50; ++i) ASSERT_EQ(e.succ.Send(std::to_string(i)), "");
  for (int i = 0; i < 50; ++i) ASSERT_EQ(e.pred.Read(), std::to_string(i));
  const RelayStats s = relay->stats();
  EXPECT_EQ(s.edges_paired, 1u);
  EXPECT_EQ(s.edges_active, 1u);
  EXPECT_GE(s.bytes_forwarded, big.size() + 8);
}

TEST(RelayServerTest, AnEndThatLeavesClosesItsPartnerAndFreesTheEdge) {
  auto relay = StartRelay(Fast());
  auto e = std::make_unique<Edge>();
  e->Open(relay->port(), "e");
  e->pred.Close();
  EXPECT_EQ(e->succ.Read(), "closed: partner closed");
  e = std::make_unique<Edge>();
  e->Open(relay->port(), "e");  // both roles are free again
}

TEST(RelayServerTest, RefusalsLeaveTheEstablishedEdgeAlone) {
  RelayOptions o = Fast();
  o.max_message_bytes = 64 * 1024;
  auto relay = StartRelay(o);
  Edge live;
  live.Open(relay->port(), "live");

  {  // wrong token
    WsClient c;
    ASSERT_EQ(c.Connect(relay->port(), "/edge/other"), "");
    ASSERT_EQ(c.Hello("other", Role::kPredecessorSide, "not the ring secret!!"), "");
    EXPECT_EQ(c.Read(), "closed: bad token");
  }
  {  // a token for another edge, or for the other role
    WsClient c;
    ASSERT_EQ(c.Connect(relay->port(), "/edge/other"), "");
    ASSERT_EQ(c.Send(EdgeHello(Bytes(kSecret), "live", Role::kPredecessorSide)), "");
    EXPECT_EQ(c.Read(), "closed: bad token");
    WsClient d;
    ASSERT_EQ(d.Connect(relay->port(), "/edge/other"), "");
    std::string hello = EdgeHello(Bytes(kSecret), "other", Role::kSuccessorSide);
    hello[0] = static_cast<char>(Role::kPredecessorSide);
    ASSERT_EQ(d.Send(hello), "");
    EXPECT_EQ(d.Read(), "closed: bad token");
  }
  for (const std::string& bad : {std::string("\x07") + std::string(32, 'a'), std::string("\x01"),
                                 std::string(32, '\x01')}) {  // bad preamble byte, short
    WsClient c;
    ASSERT_EQ(c.Connect(relay->port(), "/edge/other"), "");
    ASSERT_EQ(c.Send(bad), "");
    EXPECT_EQ(c.Read(), "closed: bad preamble");
  }
  {  // longer than a hello: refused on the frame header, with close 1009 (message too big)
    WsClient c;
    ASSERT_EQ(c.Connect(relay->port(), "/edge/other"), "");
    (void)c.Send(std::string(100, '\x01'));
    EXPECT_THAT(c.Read(), HasSubstr("closed"));
    EXPECT_EQ(c.ws().reason().code, websocket::close_code::too_big);
  }
  {  // a text first message (valid UTF-8, else WebSocket itself refuses it)
    WsClient c;
    ASSERT_EQ(c.Connect(relay->port(), "/edge/other"), "");
    ASSERT_EQ(c.Send("\x01" + std::string(32, 'a'), /*binary=*/false), "");
    EXPECT_EQ(c.Read(), "closed: bad preamble");
  }
  {  // a third end for a taken role
    WsClient c;
    ASSERT_EQ(c.Connect(relay->port(), "/edge/live"), "");
    ASSERT_EQ(c.Hello("live", Role::kSuccessorSide), "");
    EXPECT_EQ(c.Read(), "closed: role taken");
  }
  {  // connects and says nothing: over TCP, and after the upgrade
    auto raw = Raw(relay->port());
    WsClient c;
    ASSERT_EQ(c.Connect(relay->port(), "/edge/quiet"), "");
    // Dropped by the relay after its hello timeout (400 ms), long before this read's deadline.
    EXPECT_THAT(c.Read(), ::testing::AllOf(HasSubstr("error"), Not(HasSubstr("timed out"))));
    std::string line;
    EXPECT_FALSE(std::getline(*raw, line));  // the silent TCP client was dropped too
    EXPECT_NE(raw->error(), asio::error::timed_out);
  }
  live.ExpectWorks();

  {  // an oversized message closes that edge (both ends), not the others
    Edge big;
    big.Open(relay->port(), "big");
    // The relay stops reading at the limit and closes; with bytes still unread, TCP may reset the
    // sender before or after it has written them, so the send itself may fail.
    (void)big.pred.Send(std::string(100 * 1024, 'x'));
    EXPECT_THAT(big.pred.Read(), ::testing::AnyOf(HasSubstr("closed"), HasSubstr("error")));
    EXPECT_EQ(big.succ.Read(), "closed: partner closed");
  }
  live.ExpectWorks();
  EXPECT_EQ(relay->stats().edges_active, 1u);
}

TEST(RelayServerTest, AnEndWithoutPartnerIsClosedAfterThePairTimeout) {
  auto relay = StartRelay(Fast());
  WsClient c;
  ASSERT_EQ(c.Connect(relay->port(), "/edge/alone"), "");
  ASSERT_EQ(c.Hello("alone", Role::kSuccessorSide), "");
  EXPECT_EQ(c.Read(3000), "closed: partner did not arrive");
  Edge e;
  e.Open(relay->port(), "alone");
}

// A waiting end may send before its partner arrives: the relay reads that one message, holds it
// (and the end) and delivers it once paired.
TEST(RelayServerTest, AMessageSentBeforeThePartnerArrivesIsDeliveredToIt) {
  RelayOptions o = Fast();
  o.pair_timeout_ms = kDeadlineMs;
  auto relay = StartRelay(o);
  for (int i = 0; i < 20; ++i) {
    const std::string id = "early-" + std::to_string(i);
    WsClient pred, succ;
    ASSERT_EQ(pred.Connect(relay->port(), "/edge/" + id), "");
    ASSERT_EQ(pred.Hello(id, Role::kPredecessorSide), "");
    ASSERT_TRUE(WaitFor(*relay, [](const RelayStats& s) { return s.reserved == 1; }));
    ASSERT_EQ(pred.Send("early"), "");
    ASSERT_EQ(succ.Connect(relay->port(), "/edge/" + id), "");
    ASSERT_EQ(succ.Hello(id, Role::kSuccessorSide), "");
    EXPECT_EQ(succ.Read(), "early");
    ASSERT_EQ(succ.Send("back"), "");
    EXPECT_EQ(pred.Read(), "back");
  }
}

TEST(RelayServerTest, BadPathsAndPlainHttpAreRefused) {
  auto relay = StartRelay(Fast());
  auto get = [&](const std::string& target, bool upgrade) {
    auto raw = Raw(relay->port());
    tcp::iostream& s = *raw;
    s << "GET " << target << " HTTP/1.1\r\nHost: x\r\n";
    if (upgrade) {
      s << "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    }
    s << "\r\n" << std::flush;
    std::string status;
    std::getline(s, status);
    return status;
  };
  EXPECT_THAT(get("/edge/ok", false), HasSubstr("426"));
  EXPECT_THAT(get("/", true), HasSubstr("404"));
  EXPECT_THAT(get("/edge/", true), HasSubstr("404"));
  EXPECT_THAT(get("/edge/a/b", true), HasSubstr("404"));
  EXPECT_THAT(get("/edge/" + std::string(65, 'a'), true), HasSubstr("404"));
}

TEST(RelayServerTest, TooManyPendingConnectionsFromOneAddressAreRefused) {
  RelayOptions o = Fast();
  o.max_pending_per_address = 3;
  o.hello_timeout_ms = 3000;
  auto relay = StartRelay(o);
  std::vector<std::unique_ptr<tcp::iostream>> held;
  for (int i = 0; i < 3; ++i) held.push_back(Raw(relay->port()));
  ASSERT_TRUE(WaitFor(*relay, [&](const RelayStats& s) { return s.pending == 3; }));
  auto extra = Raw(relay->port());
  std::string status;
  std::getline(*extra, status);
  EXPECT_THAT(status, HasSubstr("503"));
  held.clear();  // once they go, connections are accepted again
  ASSERT_TRUE(WaitFor(*relay, [&](const RelayStats& s) { return s.pending == 0; }));
  Edge e;
  e.Open(relay->port(), "after");
}

// The pending places are full, all taken by one address: its next connection is refused, one from
// another address takes the place of one of its, and the partner of an end that waits is expected:
// it joins the reserve (with the waiting end, whose token verified) and pairs.
TEST(RelayServerTest, AFullRelayRefusesTheBiggestHolderAndAdmitsAnotherAddress) {
  RelayOptions o = Fast();
  o.max_pending_per_address = 100;
  o.max_pending_total = 4;
  o.hello_timeout_ms = o.pressed_hello_timeout_ms = 5000;
  o.pair_timeout_ms = kDeadlineMs;
  auto relay = StartRelay(o);
  WsClient waiting;
  ASSERT_EQ(waiting.Connect(relay->port(), "/edge/b"), "");
  ASSERT_EQ(waiting.Hello("b", Role::kPredecessorSide), "");
  ASSERT_TRUE(WaitFor(*relay, [](const RelayStats& s) { return s.reserved == 1; }));
  std::vector<std::unique_ptr<tcp::iostream>> raw;
  for (int i = 0; i < 4; ++i) raw.push_back(Raw(relay->port()));
  ASSERT_TRUE(WaitFor(*relay, [](const RelayStats& s) { return s.pending == 5; }));
  auto extra = Raw(relay->port());
  std::string status;
  std::getline(*extra, status);
  EXPECT_THAT(status, HasSubstr("503"));
  kvasir::testing::RawClient other(relay->port(), "127.0.0.2");
  ASSERT_TRUE(WaitFor(*relay, [](const RelayStats& s) { return s.evicted == 1; }));
  EXPECT_EQ(relay->stats().pending, 5u);
  WsClient partner;
  ASSERT_EQ(partner.Connect(relay->port(), "/edge/b", "127.0.0.3"), "");
  ASSERT_TRUE(WaitFor(*relay, [](const RelayStats& s) { return s.reserved == 2; }));
  ASSERT_EQ(partner.Hello("b", Role::kSuccessorSide), "");
  ASSERT_EQ(waiting.Send("x"), "");
  EXPECT_EQ(partner.Read(), "x");
  EXPECT_EQ(relay->stats().reserved, 0u);
  EXPECT_EQ(relay->stats().evicted, 2u);
  EXPECT_EQ(relay->stats().pending, 3u);  // two of the four raw ones, and `other`
}

// A first message larger than the hello is refused on its frame header: the relay never buffers
// it, so sixteen such connections (the per-address limit) cost it almost nothing.
TEST(RelayServerTest, AHugeFirstMessageIsRefusedBeforeItIsBuffered) {
  RelayOptions o = Fast();
  o.max_message_bytes = uint64_t{16} << 20;  // the default limit for paired edges
  o.hello_timeout_ms = kDeadlineMs;
  auto relay = StartRelay(o);
  {  // warm up: allocations every connection makes once do not count below
    Edge e;
    e.Open(relay->port(), "warm");
  }
  ASSERT_TRUE(WaitFor(*relay, [&](const RelayStats& s) { return s.pending == 0; }));
  const uint64_t before = StatusBytes("VmRSS");
  constexpr int kConnections = 16;
  constexpr uint64_t kAnnounced = uint64_t{16} << 20;
  std::vector<std::unique_ptr<RawWsClient>> clients;
  for (int i = 0; i < kConnections; ++i) {
    clients.push_back(std::make_unique<RawWsClient>(relay->port()));
    ASSERT_THAT(clients.back()->Upgrade("/edge/huge" + std::to_string(i)), HasSubstr("101"));
    // All of it goes out: the relay reads and discards what follows the refused header.
    (void)clients.back()->SendHugeMessage(kAnnounced);
    EXPECT_EQ(clients.back()->ReadCloseCode(), 1009) << "close 1009: message too big";
  }
  // The peak, not one sample: memory held for a moment counts too.
  const uint64_t after = StatusBytes("VmHWM");
  const uint64_t grown = after > before ? after - before : 0;
  std::printf(
      "relay RSS %.1f MiB, peak %.1f MiB after %d unauthenticated %.0f MiB first messages\n",
      before / 1048576.0, after / 1048576.0, kConnections, kAnnounced / 1048576.0);
  // Buffering them would take 16 x 16 MiB; what is left is a few KiB per connection.
  EXPECT_LT(grown, uint64_t{8} << 20);
  EXPECT_GE(relay->stats().refused, static_cast<uint64_t>(kConnections));
  clients.clear();
  ASSERT_TRUE(WaitFor(*relay, [&](const RelayStats& s) { return s.pending == 0; }));
  // The limit rises once the token passes: a paired edge carries a message of 1 MiB.
  Edge e;
  e.Open(relay->port(), "after");
  const std::string big(1 << 20, 'b');
  ASSERT_EQ(e.pred.Send(big), "");
  EXPECT_EQ(e.succ.Read(), big);
}

TEST(RelayServerTest, ASecondRelayServesTheSameHeldSocket) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 64), 0);
  RelayOptions o = Fast();
  o.listen_fd = fd;
  uint16_t port = 0;
  for (int round = 0; round < 2; ++round) {
    auto relay = StartRelay(o);
    ASSERT_NE(relay, nullptr);
    if (round == 0) port = relay->port();
    EXPECT_EQ(relay->port(), port);
    Edge e;
    e.Open(relay->port(), "held");
  }
  ::close(fd);
}

TEST(RelayServerTest, AStalledReceiverHoldsOnlyItsOwnEdge) {
  auto relay = StartRelay(Fast());
  Edge stalled;
  stalled.Open(relay->port(), "stalled");
  // The successor stops reading; its predecessor keeps writing until TCP flow control holds it.
  // 64 MiB is far more than the socket buffers on the way can hold, so the flood must stall.
  constexpr int kChunks = 128;
  constexpr size_t kChunk = 512 * 1024;
  std::atomic<int> sent{0};
  std::thread flood([&] {
    const std::string chunk(kChunk, 'y');
    for (int i = 0; i < kChunks; ++i) {
      if (stalled.pred.Send(chunk, true, 60000) != "") break;
      ++sent;
    }
  });
  // The relay is forwarding into the stalled receiver.
  ASSERT_TRUE(
      WaitFor(*relay, [&](const RelayStats& s) { return s.bytes_forwarded >= 2 * kChunk; }));
  Edge other;
  other.Open(relay->port(), "other");
  for (int i = 0; i < 20; ++i) other.ExpectWorks();
  EXPECT_LT(sent.load(), kChunks) << "the flood never stalled, so this showed nothing";
  // Drain the stalled edge so the flood can finish.
  stalled.succ.ws().read_message_max(0);
  int got = 0;
  while (got < kChunks && stalled.succ.Read().size() == kChunk) ++got;
  flood.join();
  EXPECT_EQ(got, kChunks);
}

TEST(RelayServerTest, WssWithAVerifiedCertificate) {
  testing::TempDir dir;
  const std::string cert = dir.File("cert.pem"), key = dir.File("key.pem");
  if (const std::string why = testing::MakeTestCertificate(cert, key, "IP:127.0.0.1");
      !why.empty()) {
    KV_SKIP_OR_FAIL(why);
  }
  RelayOptions o = Fast();
  o.tls_cert = cert;
  o.tls_key = key;
  auto relay = StartRelay(o);
  ASSERT_TRUE(relay->tls());
  ssl::context ctx(ssl::context::tls_client);
  ctx.load_verify_file(cert);
  ctx.set_verify_mode(ssl::verify_peer);
  Client<beast::ssl_stream<beast::tcp_stream>> pred(ctx), succ(ctx);
  ASSERT_EQ(pred.Connect(relay->port(), "/edge/tls"), "");
  ASSERT_EQ(pred.Hello("tls", Role::kPredecessorSide), "");
  ASSERT_EQ(succ.Connect(relay->port(), "/edge/tls"), "");
  ASSERT_EQ(succ.Hello("tls", Role::kSuccessorSide), "");
  ASSERT_EQ(pred.Send("over tls"), "");
  EXPECT_EQ(succ.Read(), "over tls");
  // A client speaking plain ws to the TLS port gets nowhere, and does not disturb the edge.
  WsClient plain;
  EXPECT_NE(plain.Connect(relay->port(), "/edge/x"), "");
  ASSERT_EQ(succ.Send("still here"), "");
  EXPECT_EQ(pred.Read(), "still here");
}

TEST(RelayServerTest, StartRefusesBadSettings) {
  RelayOptions o = Fast();
  o.tls_cert = "/nonexistent/cert.pem";
  EXPECT_THAT(RelayServer::Start(o).status().message(), HasSubstr("go together"));
  o.tls_key = "/nonexistent/key.pem";
  EXPECT_THAT(RelayServer::Start(o).status().message(), HasSubstr("cannot load the certificate"));
  o = Fast();
  o.listen = "nonsense";
  EXPECT_FALSE(RelayServer::Start(o).ok());
  o = Fast();
  o.secret = "short";
  EXPECT_THAT(RelayServer::Start(o).status().message(), HasSubstr("at least 16 bytes"));
  o = Fast();
  o.max_message_bytes = 32;
  EXPECT_THAT(RelayServer::Start(o).status().message(), HasSubstr("must hold the edge hello"));
  o = Fast();
  o.max_pending_total = 0;
  EXPECT_THAT(RelayServer::Start(o).status().message(), HasSubstr("at least 1"));
}

}  // namespace
}  // namespace kvasir::relay
