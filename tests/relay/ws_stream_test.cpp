// The relay client (DialRelayEdge) against a scripted WebSocket server written here with Beast:
// bytes round-trip in order over ws:// and wss://, the edge hello comes first, certificates are
// verified, the relay's close reason reaches the reader, Shutdown wakes a blocked read, and every
// dial ends within its timeout.
#include <utility>  // before Asio (Boost 1.74 under GCC 12, C++20)

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "net/stream.h"
#include "relay/edge_token.h"
#include "relay/ws_stream.h"
#include "test_assets.h"

namespace kvasir::relay {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace websocket = boost::beast::websocket;
namespace ssl = boost::asio::ssl;
using tcp = asio::ip::tcp;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kSecret = "0123456789abcdef-test-secret";

std::span<const uint8_t> SecretBytes() {
  return {reinterpret_cast<const uint8_t*>(kSecret.data()), kSecret.size()};
}

// Generous deadlines: each check below ends on its event long before; they only stop a broken
// client from hanging the test.
constexpr auto kDeadline = std::chrono::seconds(20);

// A self-signed certificate for 127.0.0.1 (IP only: "localhost" must not verify). "" or why not.
std::string MakeCertificate(const testing::TempDir& dir) {
  return testing::MakeTestCertificate(dir.File("cert.pem"), dir.File("key.pem"), "IP:127.0.0.1");
}

// A TCP port on 127.0.0.1 that is bound but not listening, held for the test's lifetime: a
// connection to it is refused, and no other process can take the port meanwhile.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~RefusingPort() { ::close(fd_); }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// A scripted relay: accepts on 127.0.0.1, upgrades (over TLS when given a certificate), records
// the request target and the first message, then behaves as `mode` says.
class FakeRelay {
 public:
  enum class Mode {
    kEcho,         // sends every message back
    kCloseReason,  // closes with 1008 "role taken" after the hello
    kCloseNormal,  // closes with 1000 after the hello
    kMute,         // reads the hello, then reads nothing more (answers no ping)
    kSilent,       // accepts TCP and says nothing (no upgrade)
  };

  explicit FakeRelay(Mode mode, const std::string& cert = "", const std::string& key = "")
      : mode_(mode), acceptor_(ioc_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    if (!cert.empty()) {
      tls_.emplace(ssl::context::tls_server);
      tls_->use_certificate_chain_file(cert);
      tls_->use_private_key_file(key, ssl::context::pem);
    }
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~FakeRelay() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    (void)net::DialTcp("127.0.0.1", port_, 1000);  // wakes the blocking accept()
    accept_thread_.join();
    for (auto& t : conns_) t.join();
  }

  uint16_t port() const { return port_; }
  std::string Url(const std::string& edge, const std::string& host = "127.0.0.1") const {
    return (tls_ ? "wss://" : "ws://") + host + ":" + std::to_string(port_) + "/edge/" + edge;
  }

  // Waits until the first message of a connection has arrived.
  bool WaitHello() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(5), [this] { return !hello_.empty(); });
  }
  std::string hello() {
    std::lock_guard<std::mutex> lock(mu_);
    return hello_;
  }
  std::string target() {
    std::lock_guard<std::mutex> lock(mu_);
    return target_;
  }
  std::vector<size_t> sizes() {
    std::lock_guard<std::mutex> lock(mu_);
    return sizes_;
  }

 private:
  void AcceptLoop() {
    while (true) {
      tcp::socket sock(ioc_);
      boost::system::error_code ec;
      acceptor_.accept(sock, ec);
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || ec) return;
      fds_.push_back(sock.native_handle());
      conns_.emplace_back([this, s = std::move(sock)]() mutable { Serve(std::move(s)); });
    }
  }

  void Serve(tcp::socket sock) {
    if (tls_) {
      websocket::stream<beast::ssl_stream<tcp::socket>> ws(std::move(sock), *tls_);
      Speak(ws);
    } else {
      websocket::stream<tcp::socket> ws(std::move(sock));
      Speak(ws);
    }
  }

  template <class Ws>
  void Speak(Ws& ws) {
    try {
      if (mode_ != Mode::kSilent) Script(ws);
    } catch (const std::exception&) {
      // The client went away, or the test is ending.
    }
    // Keep the socket, and so its descriptor number, until the destructor has shut it down.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return stop_; });
  }

  template <class Ws>
  void Script(Ws& ws) {
    if constexpr (!std::is_same_v<Ws, websocket::stream<tcp::socket>>) {
      ws.next_layer().handshake(ssl::stream_base::server);
    }
    beast::flat_buffer buf;
    http::request<http::string_body> req;
    http::read(ws.next_layer(), buf, req);
    ws.accept(req);
    beast::flat_buffer msg;
    ws.read(msg);
    {
      std::lock_guard<std::mutex> lock(mu_);
      target_ = std::string(req.target());
      hello_ = beast::buffers_to_string(msg.data());
    }
    cv_.notify_all();
    msg.clear();
    switch (mode_) {
      case Mode::kEcho:
        ws.binary(true);
        while (true) {
          ws.read(msg);
          {
            std::lock_guard<std::mutex> lock(mu_);
            sizes_.push_back(msg.size());
          }
          ws.write(msg.data());
          msg.clear();
        }
      case Mode::kCloseReason:
      case Mode::kCloseNormal:
        ws.close(mode_ == Mode::kCloseNormal
                     ? websocket::close_reason(websocket::close_code::normal)
                     : websocket::close_reason(websocket::close_code::policy_error, "role taken"));
        while (true) ws.read(msg);
      case Mode::kMute:
      case Mode::kSilent:
        return;
    }
  }

  Mode mode_;
  asio::io_context ioc_;
  std::optional<ssl::context> tls_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::thread accept_thread_;
  std::vector<std::thread> conns_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<int> fds_;
  std::string hello_, target_;
  std::vector<size_t> sizes_;
};

RelayDialOptions Fast() {
  RelayDialOptions o;
  o.connect_timeout_ms = 3000;
  return o;
}

// Writes `n` patterned bytes in one WriteAll and reads them back through the echo.
void RoundTrip(net::Stream& s, FakeRelay& relay, size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>((i * 7919) >> 3);
  ASSERT_TRUE(s.WriteAll(out).ok());
  std::vector<uint8_t> in;
  std::vector<uint8_t> buf(100003);
  while (in.size() < n) {
    auto got = s.ReadSome(buf);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_GT(*got, 0u);
    in.insert(in.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(*got));
  }
  EXPECT_TRUE(in == out) << "bytes came back changed or out of order";
}

void ExpectHello(FakeRelay& relay, const std::string& edge, Role role) {
  ASSERT_TRUE(relay.WaitHello());
  const std::string hello = relay.hello();
  ASSERT_EQ(hello.size(), kHelloBytes);
  EXPECT_EQ(static_cast<uint8_t>(hello[0]), static_cast<uint8_t>(role));
  const EdgeToken token = MakeEdgeToken(SecretBytes(), edge, role);
  EXPECT_EQ(hello.substr(1), std::string(token.begin(), token.end()));
  EXPECT_EQ(relay.target(), "/edge/" + edge);
}

TEST(WsStreamTest, BytesRoundTripInOrderAsMessagesOfAtMostOneMiB) {
  FakeRelay relay(FakeRelay::Mode::kEcho);
  auto s = DialRelayEdge(relay.Url("ring1-a-b"), Role::kSuccessorSide, SecretBytes(), Fast());
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ((*s)->peer(), relay.Url("ring1-a-b"));
  ExpectHello(relay, "ring1-a-b", Role::kSuccessorSide);
  RoundTrip(**s, relay, 3 * kMaxClientMessage + 17);
  RoundTrip(**s, relay, 5);
  const std::vector<size_t> want = {kMaxClientMessage, kMaxClientMessage, kMaxClientMessage, 17, 5};
  EXPECT_EQ(relay.sizes(), want);
}

TEST(WsStreamTest, WssWithTheCaRoundTrips) {
  testing::TempDir dir;
  if (const std::string why = MakeCertificate(dir); !why.empty()) KV_SKIP_OR_FAIL(why);
  FakeRelay relay(FakeRelay::Mode::kEcho, dir.File("cert.pem"), dir.File("key.pem"));
  RelayDialOptions o = Fast();
  o.ca_file = dir.File("cert.pem");
  auto s = DialRelayEdge(relay.Url("e.1"), Role::kPredecessorSide, SecretBytes(), o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ExpectHello(relay, "e.1", Role::kPredecessorSide);
  RoundTrip(**s, relay, kMaxClientMessage + 1);
}

TEST(WsStreamTest, CertificatesAreVerified) {
  testing::TempDir dir;
  if (const std::string why = MakeCertificate(dir); !why.empty()) KV_SKIP_OR_FAIL(why);
  FakeRelay relay(FakeRelay::Mode::kEcho, dir.File("cert.pem"), dir.File("key.pem"));
  // Without --ca the self-signed certificate is not trusted.
  auto s = DialRelayEdge(relay.Url("e"), Role::kPredecessorSide, SecretBytes(), Fast());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("certificate verify failed"));
  EXPECT_THAT(s.status().message(), HasSubstr("--ca"));
  // Trusted, but issued for 127.0.0.1, not for "localhost".
  RelayDialOptions o = Fast();
  o.ca_file = dir.File("cert.pem");
  s = DialRelayEdge(relay.Url("e", "localhost"), Role::kPredecessorSide, SecretBytes(), o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("TLS handshake failed"));
  // A --ca that is not there.
  o.ca_file = dir.File("missing.pem");
  s = DialRelayEdge(relay.Url("e"), Role::kPredecessorSide, SecretBytes(), o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("missing.pem: cannot load CA certificates"));
}

TEST(WsStreamTest, TheRelaysCloseReasonEndsTheStream) {
  {
    FakeRelay relay(FakeRelay::Mode::kCloseReason);
    auto s = DialRelayEdge(relay.Url("e"), Role::kPredecessorSide, SecretBytes(), Fast());
    ASSERT_TRUE(s.ok()) << s.status().message();
    uint8_t buf[16];
    auto got = (*s)->ReadSome(buf);
    ASSERT_FALSE(got.ok());
    EXPECT_THAT(got.status().message(), HasSubstr("relay closed the edge: role taken"));
    EXPECT_THAT(got.status().message(), HasSubstr("1008"));
    // Writing after the end fails too, with the same reason.
    const uint8_t byte = 1;
    EXPECT_THAT((*s)->WriteAll({&byte, 1}).message(), HasSubstr("role taken"));
  }
  {
    FakeRelay relay(FakeRelay::Mode::kCloseNormal);
    auto s = DialRelayEdge(relay.Url("e"), Role::kPredecessorSide, SecretBytes(), Fast());
    ASSERT_TRUE(s.ok()) << s.status().message();
    uint8_t buf[16];
    auto got = (*s)->ReadSome(buf);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(*got, 0u);  // an orderly end, as a TCP peer closing
  }
}

TEST(WsStreamTest, ShutdownWakesABlockedRead) {
  FakeRelay relay(FakeRelay::Mode::kEcho);
  auto s = DialRelayEdge(relay.Url("e"), Role::kSuccessorSide, SecretBytes(), Fast());
  ASSERT_TRUE(s.ok()) << s.status().message();
  net::Stream* stream = s->get();
  auto reader = std::async(std::launch::async, [stream] {
    uint8_t buf[64];
    return stream->ReadSome(buf);
  });
  ASSERT_TRUE(relay.WaitHello());
  // Nothing was sent, so the read is still waiting (a check that cannot fail by being slow).
  EXPECT_EQ(reader.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  stream->Shutdown();
  ASSERT_EQ(reader.wait_for(kDeadline), std::future_status::ready);
  auto got = reader.get();
  EXPECT_TRUE(!got.ok() || *got == 0);
  const uint8_t byte = 1;
  EXPECT_FALSE(stream->WriteAll({&byte, 1}).ok());
  stream->Shutdown();  // repeatable
}

TEST(WsStreamTest, ARelayThatStopsAnsweringIsNoticedByKeepAlive) {
  FakeRelay relay(FakeRelay::Mode::kMute);
  RelayDialOptions o = Fast();
  o.idle_timeout_ms = 400;
  auto s = DialRelayEdge(relay.Url("e"), Role::kSuccessorSide, SecretBytes(), o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  net::Stream* stream = s->get();
  // Without keep-alive this read would wait forever: the mute relay never closes.
  auto reader = std::async(std::launch::async, [stream] {
    uint8_t buf[16];
    return stream->ReadSome(buf);
  });
  if (reader.wait_for(kDeadline) != std::future_status::ready) {
    stream->Shutdown();  // lets the reader end, so the test fails rather than hangs
    FAIL() << "a relay that stopped answering was not noticed";
  }
  auto got = reader.get();
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("keep-alive"));
}

TEST(WsStreamTest, DialsEndWithinTheirTimeout) {
  // Each dial below would take its connect timeout (60 s for the last) if it did not end on its
  // event; kDeadline tells the two apart with room to spare on a loaded machine.
  // Nothing listening: refused at once.
  RefusingPort closed;
  ASSERT_NE(closed.port(), 0);
  RelayDialOptions slow = Fast();
  slow.connect_timeout_ms = 60000;
  auto t0 = Clock::now();
  auto s = DialRelayEdge(fmt::format("ws://127.0.0.1:{}/edge/e", closed.port()),
                         Role::kSuccessorSide, SecretBytes(), slow);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("cannot connect"));
  EXPECT_LT(Clock::now() - t0, kDeadline);

  // A server that accepts TCP and never answers the upgrade: the dial times out.
  FakeRelay silent(FakeRelay::Mode::kSilent);
  RelayDialOptions o;
  o.connect_timeout_ms = 300;
  t0 = Clock::now();
  s = DialRelayEdge(silent.Url("e"), Role::kSuccessorSide, SecretBytes(), o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("timed out"));
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(300));  // it waited for its timeout

  // A stopping stage abandons its dial.
  o.connect_timeout_ms = 60000;
  std::atomic<bool> stopping{false};
  o.cancelled = [&stopping] { return stopping.load(); };
  auto dial = std::async(std::launch::async, [&] {
    return DialRelayEdge(silent.Url("e"), Role::kSuccessorSide, SecretBytes(), o);
  });
  stopping = true;
  ASSERT_EQ(dial.wait_for(kDeadline), std::future_status::ready) << "the dial ignored cancelled";
  s = dial.get();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("cancelled"));
}

TEST(WsStreamTest, EdgeUrlsAreChecked) {
  auto u = ParseRelayEdgeUrl("wss://relay.example/edge/ring1-r0-r1");
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_EQ(u->edge_id, "ring1-r0-r1");
  EXPECT_EQ(u->url.port, 443);
  EXPECT_THAT(ParseRelayEdgeUrl("https://relay/edge/a").status().message(), HasSubstr("ws://"));
  EXPECT_THAT(ParseRelayEdgeUrl("ws://relay/edges/a").status().message(),
              HasSubstr("/edge/<edge-id>"));
  EXPECT_THAT(ParseRelayEdgeUrl("ws://relay/edge/").status().message(),
              HasSubstr("is not an edge id"));
  EXPECT_THAT(ParseRelayEdgeUrl("ws://relay/edge/a/b").status().message(),
              HasSubstr("is not an edge id"));
  EXPECT_THAT(ParseRelayEdgeUrl("ws://relay/edge/a?x=1").status().message(),
              HasSubstr("is not an edge id"));
  EXPECT_FALSE(ParseRelayEdgeUrl("ws://relay/edge/" + std::string(65, 'a')).ok());
  auto d = DialRelayEdge("ws://relay/nope", Role::kSuccessorSide, SecretBytes(), Fast());
  EXPECT_THAT(d.status().message(), HasSubstr("/edge/<edge-id>"));
}

}  // namespace
}  // namespace kvasir::relay
