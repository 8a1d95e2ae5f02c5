// The relay server against raw WebSocket clients: pairing and bridging, and every refusal of
// docs/RELAY.md (wrong token, bad preamble, a taken role, an oversized message, a silent client, a
// missing partner, too many pending connections, bad paths) without disturbing an established edge.
#include "relay/relay_server.h"

#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <cstdlib>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fstream>
#include <thread>

#include "relay/edge_token.h"
#include "test_assets.h"

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

const std::string kSecret = "a ring secret of 32 bytes.......";

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// A WebSocket client for tests: every operation is bounded by a timeout.
template <class Next>
class Client {
 public:
  template <class... Args>
  explicit Client(Args&&... args) : ws_(ioc_, std::forward<Args>(args)...) {}

  // TCP connect and upgrade to `path`. Returns the error text, "" on success.
  std::string Connect(uint16_t port, const std::string& path) {
    error_code ec = Run([&](auto h) {
      beast::get_lowest_layer(ws_).async_connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), h);
    });
    if (ec) return "connect: " + ec.message();
    if constexpr (!std::is_same_v<Next, beast::tcp_stream>) {
      ec = Run([&](auto h) { ws_.next_layer().async_handshake(ssl::stream_base::client, h); });
      if (ec) return "tls: " + ec.message();
    }
    ec = Run([&](auto h) { ws_.async_handshake("127.0.0.1", path, h); });
    return ec ? "upgrade: " + ec.message() : "";
  }
  std::string Hello(const std::string& edge, Role role, const std::string& secret = kSecret) {
    return Send(EdgeHello(Bytes(secret), edge, role));
  }
  std::string Send(const std::string& bytes, bool binary = true) {
    ws_.binary(binary);
    error_code ec = Run([&](auto h) { ws_.async_write(asio::buffer(bytes), h); });
    return ec ? ec.message() : "";
  }
  // The next message, or "closed: <reason>" / "error: <text>".
  std::string Read(int timeout_ms = 3000) {
    beast::flat_buffer buf;
    error_code ec = Run([&](auto h) { ws_.async_read(buf, h); }, timeout_ms);
    if (ec == websocket::error::closed) return "closed: " + std::string(ws_.reason().reason.data(), ws_.reason().reason.size());
    if (ec) return "error: " + ec.message();
    return beast::buffers_to_string(buf.data());
  }
  void Close() {
    Run([&](auto h) { ws_.async_close(websocket::close_code::normal, h); }, 1000);
  }
  websocket::stream<Next>& ws() { return ws_; }

 private:
  template <class Start>
  error_code Run(Start&& start, int timeout_ms = 3000) {
    error_code result = asio::error::timed_out;
    bool done = false;
    start([&](error_code ec, auto&&...) {
      result = ec;
      done = true;
    });
    ioc_.restart();
    ioc_.run_for(std::chrono::milliseconds(timeout_ms));
    if (!done) {
      beast::get_lowest_layer(ws_).cancel();
      ioc_.restart();
      ioc_.run_for(std::chrono::milliseconds(500));
      return asio::error::timed_out;
    }
    return result;
  }
  asio::io_context ioc_;
  websocket::stream<Next> ws_;
};
using WsClient = Client<beast::tcp_stream>;

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

// An edge of two connected ends, checked to carry messages both ways.
struct Edge {
  WsClient pred, succ;
  void Open(uint16_t port, const std::string& id) {
    ASSERT_EQ(pred.Connect(port, "/edge/" + id), "");
    ASSERT_EQ(pred.Hello(id, Role::kPredecessorSide), "");
    ASSERT_EQ(succ.Connect(port, "/edge/" + id), "");
    ASSERT_EQ(succ.Hello(id, Role::kSuccessorSide), "");
    ExpectWorks();
  }
  void ExpectWorks() {
    ASSERT_EQ(pred.Send("ping"), "");
    EXPECT_EQ(succ.Read(), "ping");
    ASSERT_EQ(succ.Send("pong"), "");
    EXPECT_EQ(pred.Read(), "pong");
  }
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
                                 std::string(100, '\x01')}) {  // bad preamble byte, bad length
    WsClient c;
    ASSERT_EQ(c.Connect(relay->port(), "/edge/other"), "");
    ASSERT_EQ(c.Send(bad), "");
    EXPECT_EQ(c.Read(), "closed: bad preamble");
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
    tcp::iostream raw("127.0.0.1", std::to_string(relay->port()));
    WsClient c;
    ASSERT_EQ(c.Connect(relay->port(), "/edge/quiet"), "");
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_THAT(c.Read(2000), HasSubstr("error"));  // dropped after the hello timeout
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
    std::string line;
    EXPECT_FALSE(std::getline(raw, line));  // the silent TCP client was dropped too
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

TEST(RelayServerTest, BadPathsAndPlainHttpAreRefused) {
  auto relay = StartRelay(Fast());
  auto get = [&](const std::string& target, bool upgrade) {
    tcp::iostream s("127.0.0.1", std::to_string(relay->port()));
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
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<tcp::iostream>("127.0.0.1", std::to_string(relay->port())));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  tcp::iostream extra("127.0.0.1", std::to_string(relay->port()));
  std::string status;
  std::getline(extra, status);
  EXPECT_THAT(status, HasSubstr("503"));
  held.clear();  // once they go, connections are accepted again
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Edge e;
  e.Open(relay->port(), "after");
}

TEST(RelayServerTest, AStalledReceiverHoldsOnlyItsOwnEdge) {
  auto relay = StartRelay(Fast());
  Edge stalled;
  stalled.Open(relay->port(), "stalled");
  // The successor stops reading; its predecessor keeps writing until TCP flow control holds it.
  std::thread flood([&] {
    const std::string chunk(512 * 1024, 'y');
    for (int i = 0; i < 64; ++i) {
      if (stalled.pred.Send(chunk) != "") break;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  Edge other;
  other.Open(relay->port(), "other");
  for (int i = 0; i < 20; ++i) other.ExpectWorks();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  // Drain the stalled edge so the flood can finish.
  stalled.succ.ws().read_message_max(0);
  int got = 0;
  while (got < 64 && stalled.succ.Read(3000).size() == 512 * 1024) ++got;
  flood.join();
  EXPECT_EQ(got, 64);
}

TEST(RelayServerTest, WssWithAVerifiedCertificate) {
  testing::TempDir dir;
  const std::string cert = dir.File("cert.pem"), key = dir.File("key.pem");
  const std::string cmd =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout " + key + " -out " + cert +
      " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl cannot make a test certificate";
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
}

}  // namespace
}  // namespace kvasir::relay
