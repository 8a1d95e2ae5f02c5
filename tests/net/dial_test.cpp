// The shared dial (net/dial.h) on its own: the event-loop step with its deadline and cancellation,
// TCP connect errors that name the address, and a TLS handshake that ends on its deadline.
#include "net/dial.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <string>

#include "net/stream.h"
#include "net/url.h"

namespace kvasir::net {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;

// Far beyond anything below that ends on its event, far below the 60 s the operations would take.
constexpr auto kDeadline = std::chrono::seconds(20);

Url LocalUrl(uint16_t port) {
  return ParseUrl("https://127.0.0.1:" + std::to_string(port) + "/x").value();
}

TEST(DialTest, RunIoReturnsTheOperationsResult) {
  asio::io_context ioc;
  asio::steady_timer timer(ioc, std::chrono::milliseconds(1));
  error_code ec = RunIo(
      ioc, [&](auto done) { timer.async_wait(std::move(done)); },
      IoLimits{Clock::now() + kDeadline, {}}, [&] { timer.cancel(); });
  EXPECT_FALSE(ec) << ec.message();
}

TEST(DialTest, RunIoEndsAtTheDeadlineAndAbortsTheOperation) {
  asio::io_context ioc;
  asio::steady_timer timer(ioc, std::chrono::seconds(60));
  bool aborted = false;
  const auto t0 = Clock::now();
  error_code ec = RunIo(
      ioc, [&](auto done) { timer.async_wait(std::move(done)); },
      IoLimits{t0 + std::chrono::milliseconds(100), {}},
      [&] {
        aborted = true;
        timer.cancel();
      });
  EXPECT_EQ(ec, asio::error::timed_out);
  EXPECT_TRUE(aborted);
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(100));
  EXPECT_LT(Clock::now() - t0, kDeadline);
  EXPECT_EQ(DescribeIoError(ec), "timed out");
}

TEST(DialTest, RunIoGivesUpWhenTheCallerCancels) {
  asio::io_context ioc;
  asio::steady_timer timer(ioc, std::chrono::seconds(60));
  const auto t0 = Clock::now();
  error_code ec = RunIo(
      ioc, [&](auto done) { timer.async_wait(std::move(done)); },
      IoLimits{t0 + std::chrono::seconds(60), [] { return true; }}, [&] { timer.cancel(); });
  EXPECT_EQ(ec, asio::error::operation_aborted);
  EXPECT_LT(Clock::now() - t0, kDeadline);
  EXPECT_EQ(DescribeIoError(ec), "cancelled");
}

TEST(DialTest, ConnectTcpConnectsWithNoDelay) {
  auto listener = Listener::Bind("127.0.0.1", 0);  // the backlog completes the connect
  ASSERT_TRUE(listener.ok()) << listener.status().message();
  asio::io_context ioc;
  beast::tcp_stream sock(ioc);
  Status s = ConnectTcp(ioc, sock, LocalUrl(listener->port()), {Clock::now() + kDeadline, {}});
  ASSERT_TRUE(s.ok()) << s.message();
  asio::ip::tcp::no_delay no_delay;
  sock.socket().get_option(no_delay);
  EXPECT_TRUE(no_delay.value());
}

TEST(DialTest, ConnectTcpErrorsNameTheUrlAndTheAddress) {
  uint16_t port = 0;
  {
    auto l = Listener::Bind("127.0.0.1", 0);
    ASSERT_TRUE(l.ok()) << l.status().message();
    port = l->port();
  }
  asio::io_context ioc;
  beast::tcp_stream sock(ioc);
  const Url url = LocalUrl(port);
  Status s = ConnectTcp(ioc, sock, url, {Clock::now() + kDeadline, {}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr(url.ToString() + ": cannot connect to " + url.Authority()));
}

TEST(DialTest, HandshakeTlsWithASilentServerEndsOnItsDeadline) {
  auto listener = Listener::Bind("127.0.0.1", 0);  // accepts (backlog), never answers
  ASSERT_TRUE(listener.ok()) << listener.status().message();
  auto ctx = MakeTlsClientContext("");
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  asio::io_context ioc;
  beast::ssl_stream<beast::tcp_stream> tls(ioc, **ctx);
  const Url url = LocalUrl(listener->port());
  const auto t0 = Clock::now();
  ASSERT_TRUE(ConnectTcp(ioc, beast::get_lowest_layer(tls), url, {t0 + kDeadline, {}}).ok());
  Status s = HandshakeTls(ioc, tls, url, {Clock::now() + std::chrono::milliseconds(300), {}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_THAT(s.message(), HasSubstr(url.ToString() + ": TLS handshake failed: timed out"));
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(300));
  EXPECT_LT(Clock::now() - t0, kDeadline);
}

TEST(DialTest, AMissingCaFileIsNamed) {
  auto ctx = MakeTlsClientContext("/nonexistent/ca.pem");
  ASSERT_FALSE(ctx.ok());
  EXPECT_THAT(ctx.status().message(),
              HasSubstr("/nonexistent/ca.pem: cannot load CA certificates"));
}

}  // namespace
}  // namespace kvasir::net
