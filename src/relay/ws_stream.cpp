#include "relay/ws_stream.h"

// <utility> first: Boost 1.74's Asio needs it before its headers under GCC 12 in C++20 mode.
#include <utility>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "net/dial.h"

namespace kvasir::relay {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace websocket = boost::beast::websocket;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

// Received bytes not yet taken by ReadSome before reading from the relay pauses (flow control).
constexpr size_t kReadAhead = size_t{8} << 20;
// How long the relay has to answer our close frame before the connection is cut.
constexpr auto kCloseGrace = std::chrono::seconds(1);
constexpr const char* kUserAgent = "kvasir-stage/0.1";

using PlainNext = beast::tcp_stream;
using TlsNext = beast::ssl_stream<beast::tcp_stream>;

// The relay's close frame in words: "role taken (close code 1008)".
std::string DescribeClose(const websocket::close_reason& r) {
  std::string why(r.reason.data(), r.reason.size());
  if (why.empty()) {
    switch (r.code) {
      case websocket::close_code::going_away: why = "going away"; break;
      case websocket::close_code::too_big: why = "message too big"; break;
      case websocket::close_code::policy_error: why = "policy violation"; break;
      case websocket::close_code::internal_error: why = "relay error"; break;
      default: why = "no reason given"; break;
    }
  }
  return fmt::format("{} (close code {})", why, static_cast<unsigned>(r.code));
}

// One WebSocket connection to the relay. The dial runs on the caller's thread; afterwards the
// connection belongs to a private io_context thread, because a Beast stream is not thread-safe and
// a ring link reads on one thread while writing from another. That thread reads messages ahead
// into rx_; callers block on mu_/cv_ until their bytes or completions are there.
template <class Next>
class WsStream final : public net::Stream {
 public:
  static constexpr bool kTls = std::is_same_v<Next, TlsNext>;

  WsStream(net::Url url, std::unique_ptr<ssl::context> tls_ctx)
      : url_(std::move(url)),
        peer_(url_.ToString()),
        tls_ctx_(std::move(tls_ctx)),
        close_timer_(ioc_) {
    if constexpr (kTls) {
      ws_ = std::make_unique<websocket::stream<Next>>(ioc_, *tls_ctx_);
    } else {
      ws_ = std::make_unique<websocket::stream<Next>>(ioc_);
    }
  }

  ~WsStream() override {
    Shutdown();
    if (thread_.joinable()) {
      // Whatever is still in flight is abandoned: nobody waits for it any more.
      asio::post(ioc_, [this] {
        CloseSocket();
        ioc_.stop();
      });
      thread_.join();
    }
  }

  Status Dial(const std::string& hello, const RelayDialOptions& o) {
    const net::IoLimits limits{Clock::now() + std::chrono::milliseconds(o.connect_timeout_ms),
                               o.cancelled};
    KV_RETURN_IF_ERROR(net::ConnectTcp(ioc_, beast::get_lowest_layer(*ws_), url_, limits));
    if constexpr (kTls) {
      Status s = net::HandshakeTls(ioc_, ws_->next_layer(), url_, limits);
      if (s.code() == StatusCode::kUnauthenticated) {
        return Status::Error(s.message() +
                                 " (the relay's certificate does not verify; use --ca FILE to "
                                 "trust a private certificate authority)",
                             s.code());
      }
      KV_RETURN_IF_ERROR(s);
    }
    websocket::stream_base::timeout t;
    t.handshake_timeout = std::chrono::milliseconds(o.connect_timeout_ms);
    t.idle_timeout = std::chrono::milliseconds(o.idle_timeout_ms);
    t.keep_alive_pings = true;
    idle_timeout_ms_ = o.idle_timeout_ms;
    ws_->set_option(t);
    ws_->set_option(websocket::stream_base::decorator(
        [](websocket::request_type& req) { req.set(http::field::user_agent, kUserAgent); }));
    ws_->read_message_max(kMaxRelayMessage);
    ws_->auto_fragment(false);
    ws_->write_buffer_bytes(64 * 1024);
    ws_->binary(true);
    websocket::response_type res;
    const bool default_port = url_.port == (kTls ? 443 : 80);
    std::string host = url_.host.find(':') != std::string::npos ? "[" + url_.host + "]" : url_.host;
    if (!default_port) host = url_.Authority();
    error_code ec =
        Step([&](auto done) { ws_->async_handshake(res, host, url_.target, done); }, limits);
    if (ec == websocket::error::upgrade_declined && res.result_int() != 0) {
      return Error("{}: the relay refused the WebSocket upgrade: HTTP {} {}", peer_,
                   res.result_int(), std::string(res.reason()));
    }
    if (ec) return Error("{}: WebSocket upgrade failed: {}", peer_, net::DescribeIoError(ec));
    ec = Step(
        [&](auto done) {
          ws_->async_write(asio::buffer(hello), [done](error_code e, size_t) mutable { done(e); });
        },
        limits);
    if (ec) return Error("{}: sending the edge hello failed: {}", peer_, net::DescribeIoError(ec));

    // From here on the connection lives on its own thread.
    work_.emplace(ioc_.get_executor());
    ioc_.restart();
    reading_ = true;
    asio::post(ioc_, [this] { ReadNext(); });
    thread_ = std::thread([this] {
      try {
        ioc_.run();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu_);
        Fail(fmt::format("relay connection failed: {}", e.what()));
        write_done_ = true;
        write_ec_ = asio::error::fault;
      }
    });
    return Status::Ok();
  }

  Status WriteAll(std::span<const uint8_t> bytes) override {
    size_t off = 0;
    while (off < bytes.size()) {
      const size_t n = std::min(kMaxClientMessage, bytes.size() - off);
      std::unique_lock<std::mutex> lock(mu_);
      if (shut_) return Error("the relay connection is shut down");
      if (end_ == End::kError) return Error("{}", end_msg_);
      if (end_ == End::kOrderly) return Error("the relay closed the edge");
      write_done_ = false;
      // Posted under mu_, so a Shutdown() that follows is seen by the io thread after this write.
      asio::post(ioc_, [this, buf = asio::const_buffer(bytes.data() + off, n)] {
        write_in_flight_ = true;
        ws_->async_write(buf, [this](error_code ec, size_t) {
          write_in_flight_ = false;
          std::lock_guard<std::mutex> l(mu_);
          write_done_ = true;
          write_ec_ = ec;
          cv_.notify_all();
        });
      });
      // The write's buffer is the caller's: wait for its completion even after a Shutdown(),
      // which cuts the connection so the completion comes at once.
      cv_.wait(lock, [this] { return write_done_; });
      if (write_ec_) {
        if (end_ == End::kError) return Error("{}", end_msg_);
        if (shut_) return Error("the relay connection is shut down");
        return Error("sending to the relay failed: {}", net::DescribeIoError(write_ec_));
      }
      off += n;
    }
    return Status::Ok();
  }

  Result<size_t> ReadSome(std::span<uint8_t> buffer) override {
    if (buffer.empty()) return size_t{0};
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return shut_ || rx_off_ < rx_.size() || end_ != End::kOpen; });
    if (shut_) return size_t{0};
    if (rx_off_ < rx_.size()) {
      const size_t n = std::min(buffer.size(), rx_.size() - rx_off_);
      std::copy_n(rx_.data() + rx_off_, n, buffer.data());
      rx_off_ += n;
      if (rx_off_ == rx_.size()) {
        rx_.clear();
        rx_off_ = 0;
      } else if (rx_off_ >= (size_t{1} << 20) && rx_off_ * 2 >= rx_.size()) {
        rx_.erase(rx_.begin(), rx_.begin() + static_cast<std::ptrdiff_t>(rx_off_));
        rx_off_ = 0;
      }
      if (!reading_ && end_ == End::kOpen && rx_.size() - rx_off_ < kReadAhead) {
        reading_ = true;
        asio::post(ioc_, [this] { ReadNext(); });
      }
      return n;
    }
    if (end_ == End::kOrderly) return size_t{0};
    return Error("{}", end_msg_);
  }

  void Shutdown() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_) return;
    shut_ = true;
    cv_.notify_all();
    if (thread_.joinable()) asio::post(ioc_, [this] { BeginClose(); });
  }

  std::string peer() const override { return peer_; }

 private:
  enum class End { kOpen, kOrderly, kError };

  // Runs one asynchronous step of the dial on the calling thread until it completes, the dial's
  // deadline passes or the caller gives up. In the last two cases the connection is cut and the
  // step drained, so no handler refers to the caller's frame afterwards.
  template <class Start>
  error_code Step(Start&& start, const net::IoLimits& limits) {
    return net::RunIo(ioc_, std::forward<Start>(start), limits, [this] { CloseSocket(); });
  }

  // io thread from here on.
  void ReadNext() {
    ws_->async_read(msg_, [this](error_code ec, size_t) { OnRead(ec); });
  }

  void OnRead(error_code ec) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ec) {
      reading_ = false;
      if (ec == websocket::error::closed) {
        const websocket::close_reason& r = ws_->reason();
        if (r.code == websocket::close_code::normal) {
          if (end_ == End::kOpen) end_ = End::kOrderly;
          cv_.notify_all();
        } else {
          Fail(fmt::format("relay closed the edge: {}", DescribeClose(r)));
        }
      } else if (ec == beast::error::timeout) {
        Fail(fmt::format("the relay did not answer keep-alive pings for {} ms",
                         idle_timeout_ms_));
      } else if (ec == websocket::error::message_too_big) {
        Fail(fmt::format("the relay sent a message larger than {} bytes", kMaxRelayMessage));
      } else if (ec == asio::error::eof || ec == asio::error::connection_reset) {
        Fail(fmt::format("the relay dropped the connection ({})", net::DescribeIoError(ec)));
      } else {
        Fail(fmt::format("receiving from the relay failed: {}", net::DescribeIoError(ec)));
      }
      if (shut_ || end_ != End::kOpen) {
        close_timer_.cancel();
        CloseSocket();
      }
      return;
    }
    const auto data = msg_.data();
    const auto* p = static_cast<const uint8_t*>(data.data());
    rx_.insert(rx_.end(), p, p + data.size());
    msg_.consume(msg_.size());
    cv_.notify_all();
    if (!shut_ && rx_.size() - rx_off_ < kReadAhead) {
      ReadNext();
    } else {
      reading_ = false;
    }
  }

  // Records the end of the stream (the first cause wins) and wakes the callers. mu_ held.
  void Fail(std::string why) {
    if (end_ == End::kOpen) {
      end_ = End::kError;
      end_msg_ = std::move(why);
    }
    cv_.notify_all();
  }

  // A close frame first, so the relay sees an orderly end; the connection is cut if the relay does
  // not answer in time, or at once when a write is stuck (a close frame would wait behind it).
  void BeginClose() {
    if (!ws_->is_open() || write_in_flight_) {
      CloseSocket();
      return;
    }
    close_timer_.expires_after(kCloseGrace);
    close_timer_.async_wait([this](error_code ec) {
      if (!ec) CloseSocket();
    });
    ws_->async_close(websocket::close_code::normal, [this](error_code ec) {
      bool reading;
      {
        std::lock_guard<std::mutex> lock(mu_);
        reading = reading_;
      }
      // With a read pending, the read loop sees the relay's answer and cuts the connection.
      if (ec || !reading) {
        close_timer_.cancel();
        CloseSocket();
      }
    });
  }

  void CloseSocket() {
    error_code ignored;
    beast::tcp_stream& sock = beast::get_lowest_layer(*ws_);
    sock.socket().shutdown(tcp::socket::shutdown_both, ignored);
    sock.close();
  }

  net::Url url_;
  std::string peer_;
  asio::io_context ioc_;  // declared before everything that uses it, so destroyed after
  std::unique_ptr<ssl::context> tls_ctx_;
  std::unique_ptr<websocket::stream<Next>> ws_;
  asio::steady_timer close_timer_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::thread thread_;
  beast::flat_buffer msg_;       // the message being received (io thread)
  bool write_in_flight_ = false;  // io thread only
  int idle_timeout_ms_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint8_t> rx_;  // received bytes; [rx_off_, size) not yet read
  size_t rx_off_ = 0;
  bool reading_ = false;     // a read from the relay is pending
  bool shut_ = false;
  End end_ = End::kOpen;
  std::string end_msg_;
  bool write_done_ = false;
  error_code write_ec_;
};

}  // namespace

Result<RelayEdgeUrl> ParseRelayEdgeUrl(const std::string& text) {
  KV_ASSIGN_OR_RETURN(net::Url url, net::ParseWebSocketUrl(text));
  Result<std::string> id = ParseEdgePath(url.target);
  if (!id.ok()) return id.status().WithContext(text);
  return RelayEdgeUrl{std::move(url), std::move(id).value()};
}

Result<std::unique_ptr<net::Stream>> DialRelayEdge(const std::string& url, Role role,
                                                   std::span<const uint8_t> secret,
                                                   const RelayDialOptions& options) {
  KV_ASSIGN_OR_RETURN(RelayEdgeUrl edge, ParseRelayEdgeUrl(url));
  std::string hello = EdgeHello(secret, edge.edge_id, role);
  if (options.token) {
    hello.assign(1, static_cast<char>(role));
    hello.append(reinterpret_cast<const char*>(options.token->data()), options.token->size());
  }
  try {
    if (!edge.url.tls()) {
      auto s = std::make_unique<WsStream<PlainNext>>(edge.url, nullptr);
      KV_RETURN_IF_ERROR(s->Dial(hello, options));
      return std::unique_ptr<net::Stream>(std::move(s));
    }
    KV_ASSIGN_OR_RETURN(std::unique_ptr<ssl::context> ctx,
                        net::MakeTlsClientContext(options.ca_file));
    auto s = std::make_unique<WsStream<TlsNext>>(edge.url, std::move(ctx));
    KV_RETURN_IF_ERROR(s->Dial(hello, options));
    return std::unique_ptr<net::Stream>(std::move(s));
  } catch (const std::exception& e) {
    return Error("{}: {}", url, e.what());
  }
}

}  // namespace kvasir::relay
