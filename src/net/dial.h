// The secure dial shared by the HTTP client (net/http_client.h) and the relay client
// (relay/ws_stream.h): name lookup and TCP connect within a deadline, then the TLS client
// handshake with the server name sent (SNI) and the certificate verified for the host. Both run
// Boost.Asio operations to completion on the caller's thread, so this header is Asio-level; the
// byte streams of net/stream.h know nothing of it.
#pragma once

// <utility> first: Boost 1.74's Asio needs it before its headers under GCC 12 in C++20 mode.
#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <boost/system/error_code.hpp>
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "net/url.h"

namespace kvasir::net {

// How long an operation may take, and how its caller gives up early.
struct IoLimits {
  std::chrono::steady_clock::time_point deadline;
  // Polled at least every 50 ms while waiting when set; returning true abandons the operation.
  std::function<bool()> cancelled;
};

// Runs one asynchronous operation on `ioc`, on the calling thread, until its completion handler
// has run. `start(handler)` starts it; the handler takes an error_code and ignores anything after
// it. When `limits.deadline` passes first the result is asio::error::timed_out, when
// limits.cancelled() says so it is asio::error::operation_aborted; in both cases `abort()` is
// called (it must make the operation complete soon: cancel it or close its socket) and the
// operation is drained, so no handler refers to the caller's frame afterwards. `ioc` must not be
// run by another thread meanwhile.
template <class Start>
boost::system::error_code RunIo(boost::asio::io_context& ioc, Start&& start, const IoLimits& limits,
                                const std::function<void()>& abort);

// "timed out", "cancelled", else the error's own message.
std::string DescribeIoError(const boost::system::error_code& ec);

// A TLS client context that verifies the server's certificate chain: against the PEM certificates
// in `ca_file` when it is not empty (an unreadable file is an error naming it), else against the
// system's store.
Result<std::unique_ptr<boost::asio::ssl::context>> MakeTlsClientContext(const std::string& ca_file);

// Resolves url.host and connects `sock` to one of its addresses on url.port within `limits`, then
// sets TCP_NODELAY (requests and frames are small and latency-bound). Errors name the URL and what
// failed: "wss://r:8443/edge/e: cannot resolve host r: ..." or "...: cannot connect to r:8443:
// Connection refused", with code kTimeout (deadline passed) or kUnavailable (anything else,
// cancellation included).
Status ConnectTcp(boost::asio::io_context& ioc, boost::beast::tcp_stream& sock, const Url& url,
                  const IoLimits& limits);

// The TLS client handshake on a connected `tls` stream: sends url.host as the server name (SNI,
// not for IP literals) and accepts only a certificate valid for url.host, name or address (the
// chain is checked as MakeTlsClientContext set up). Errors read "<url>: TLS handshake failed:
// <why>", with code kUnauthenticated when the certificate did not verify (trying again will not
// help), else kTimeout or kUnavailable; a host name TLS cannot carry is kInvalidInput.
Status HandshakeTls(boost::asio::io_context& ioc,
                    boost::beast::ssl_stream<boost::beast::tcp_stream>& tls, const Url& url,
                    const IoLimits& limits);

// ---- implementation --------------------------------------------------------------------------

template <class Start>
boost::system::error_code RunIo(boost::asio::io_context& ioc, Start&& start, const IoLimits& limits,
                                const std::function<void()>& abort) {
  using Clock = std::chrono::steady_clock;
  boost::system::error_code result;
  bool done = false;
  start([&result, &done](boost::system::error_code ec, auto&&...) {
    result = ec;
    done = true;
  });
  ioc.restart();
  while (!done) {
    const bool late = Clock::now() >= limits.deadline;
    if (late || (limits.cancelled && limits.cancelled())) {
      abort();
      ioc.restart();
      while (!done && ioc.run_one() > 0) {
      }
      return late ? boost::asio::error::timed_out : boost::asio::error::operation_aborted;
    }
    Clock::time_point until = limits.deadline;
    if (limits.cancelled) until = std::min(until, Clock::now() + std::chrono::milliseconds(50));
    ioc.run_one_until(until);
    if (ioc.stopped()) ioc.restart();
  }
  return result;
}

}  // namespace kvasir::net
