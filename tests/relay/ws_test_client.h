// A WebSocket client for the relay tests, every operation bounded by a timeout, and an edge of
// two such clients checked to carry messages both ways.
#pragma once

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <span>
#include <string>
#include <utility>

#include "relay/edge_token.h"

namespace kvasir::relay::ws_test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = boost::beast::websocket;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;

// Every wait below ends on its event; these deadlines only stop a broken relay from hanging a test.
constexpr int kDeadlineMs = 10000;

inline const std::string kSecret = "a ring secret of 32 bytes.......";

inline std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// A WebSocket client for tests: every operation is bounded by a timeout.
template <class Next>
class Client {
 public:
  template <class... Args>
  explicit Client(Args&&... args) : ws_(ioc_, std::forward<Args>(args)...) {}

  // TCP connect and upgrade to `path`. Returns the error text, "" on success.
  // `source`: the local address to connect from ("127.0.0.2"), or "" for the default.
  std::string Connect(uint16_t port, const std::string& path, const std::string& source = "") {
    if (!source.empty()) {
      error_code bind_ec;
      auto& socket = beast::get_lowest_layer(ws_).socket();
      socket.open(tcp::v4(), bind_ec);
      if (!bind_ec) socket.bind(tcp::endpoint(asio::ip::make_address(source), 0), bind_ec);
      if (bind_ec) return "bind: " + bind_ec.message();
    }
    error_code ec = Run([&](auto h) {
      beast::get_lowest_layer(ws_).async_connect(
          tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), h);
    });
    if (ec) return "connect: " + ec.message();
    // As the stages' own client: no Nagle delay on small messages such as the hello.
    beast::get_lowest_layer(ws_).socket().set_option(tcp::no_delay(true), ec);
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
  std::string Send(const std::string& bytes, bool binary = true, int timeout_ms = kDeadlineMs) {
    ws_.binary(binary);
    error_code ec = Run([&](auto h) { ws_.async_write(asio::buffer(bytes), h); }, timeout_ms);
    return ec ? ec.message() : "";
  }
  // The next message, or "closed: <reason>" / "error: <text>".
  std::string Read(int timeout_ms = kDeadlineMs) {
    beast::flat_buffer buf;
    error_code ec = Run([&](auto h) { ws_.async_read(buf, h); }, timeout_ms);
    if (ec == websocket::error::closed)
      return "closed: " + std::string(ws_.reason().reason.data(), ws_.reason().reason.size());
    if (ec) return "error: " + ec.message();
    return beast::buffers_to_string(buf.data());
  }
  void Close() {
    Run([&](auto h) { ws_.async_close(websocket::close_code::normal, h); }, 1000);
  }
  websocket::stream<Next>& ws() { return ws_; }

 private:
  template <class Start>
  error_code Run(Start&& start, int timeout_ms = kDeadlineMs) {
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

}  // namespace kvasir::relay::ws_test
