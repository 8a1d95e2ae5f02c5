#include "net/dial.h"

// net/dial.h includes <utility> before Asio (Boost 1.74 under GCC 12 in C++20 mode needs it).
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <exception>
#include <string>
#include <utility>

namespace kvasir::net {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;

bool IsIpLiteral(const std::string& host) {
  error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

bool IsTimeout(const error_code& ec) {
  return ec == beast::error::timeout || ec == asio::error::timed_out;
}

// A failed lookup or connect is worth another try later, unless the deadline says otherwise.
StatusCode NetworkCode(const error_code& ec) {
  return IsTimeout(ec) ? StatusCode::kTimeout : StatusCode::kUnavailable;
}

}  // namespace

std::string DescribeIoError(const error_code& ec) {
  if (IsTimeout(ec)) return "timed out";
  if (ec == asio::error::operation_aborted) return "cancelled";
  return ec.message();
}

Result<std::unique_ptr<ssl::context>> MakeTlsClientContext(const std::string& ca_file) {
  std::unique_ptr<ssl::context> ctx;
  try {
    ctx = std::make_unique<ssl::context>(ssl::context::tls_client);
  } catch (const std::exception& e) {
    return Error("cannot set up TLS: {}", e.what());
  }
  error_code ec;
  ctx->set_verify_mode(ssl::verify_peer, ec);
  if (ec) return Error("cannot set up TLS certificate verification: {}", ec.message());
  if (!ca_file.empty()) {
    ctx->load_verify_file(ca_file, ec);
    if (ec) return Error("{}: cannot load CA certificates: {}", ca_file, ec.message());
  } else {
    ctx->set_default_verify_paths(ec);
    if (ec) return Error("cannot load the system's CA certificates: {}", ec.message());
  }
  return ctx;
}

Status ConnectTcp(asio::io_context& ioc, beast::tcp_stream& sock, const Url& url,
                  const IoLimits& limits) {
  const std::string where = url.ToString();
  tcp::resolver resolver(ioc);
  tcp::resolver::results_type endpoints;
  error_code ec = RunIo(
      ioc,
      [&](auto done) {
        resolver.async_resolve(
            url.host, std::to_string(url.port),
            [&endpoints, done](error_code e, tcp::resolver::results_type r) mutable {
              endpoints = std::move(r);
              done(e);
            });
      },
      limits, [&] { resolver.cancel(); });
  if (ec) {
    return Error(NetworkCode(ec), "{}: cannot resolve host {}: {}", where, url.host,
                 DescribeIoError(ec));
  }
  ec = RunIo(
      ioc, [&](auto done) { sock.async_connect(endpoints, std::move(done)); }, limits,
      [&] { sock.close(); });
  if (ec) {
    return Error(NetworkCode(ec), "{}: cannot connect to {}: {}", where, url.Authority(),
                 DescribeIoError(ec));
  }
  error_code ignored;
  sock.socket().set_option(tcp::no_delay(true), ignored);
  return Status::Ok();
}

Status HandshakeTls(asio::io_context& ioc, beast::ssl_stream<beast::tcp_stream>& tls,
                    const Url& url, const IoLimits& limits) {
  const std::string where = url.ToString();
  // SNI carries host names only; an IP literal is checked against the certificate's addresses.
  if (!IsIpLiteral(url.host) && !SSL_set_tlsext_host_name(tls.native_handle(), url.host.c_str())) {
    return Error("{}: cannot set the TLS server name {}", where, url.host);
  }
  error_code ec;
  tls.set_verify_callback(ssl::host_name_verification(url.host), ec);
  if (ec) return Error("{}: cannot set up host name verification: {}", where, ec.message());
  beast::tcp_stream& sock = beast::get_lowest_layer(tls);
  ec = RunIo(
      ioc, [&](auto done) { tls.async_handshake(ssl::stream_base::client, std::move(done)); },
      limits, [&] { sock.close(); });
  if (!ec) return Status::Ok();
  // A certificate that does not verify will not verify on a second try either.
  const bool cert = ec.category() == asio::error::get_ssl_category();
  return Error(cert ? StatusCode::kUnauthenticated : NetworkCode(ec),
               "{}: TLS handshake failed: {}", where, DescribeIoError(ec));
}

}  // namespace kvasir::net
