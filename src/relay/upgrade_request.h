// How the relay answers the HTTP request that opens a connection, before any
// WebSocket exists (docs/RELAY.md, "Refusals"). A pure function of the parsed
// request, so it is tested and fuzzed without sockets.
#pragma once

// <utility> first: Boost 1.74's Asio needs it before its headers under GCC 12
// in C++20 mode.
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/status.hpp>
#include <cstddef>
#include <string>
#include <utility>

namespace kvasir::relay {

// The most the relay reads of a request's start line and headers.
inline constexpr size_t kMaxRequestHeaderBytes = 8 * 1024;

using UpgradeRequest = boost::beast::http::request<boost::beast::http::empty_body>;

struct UpgradeVerdict {
  std::string edge_id;  // the edge the connection joins, when it may be upgraded
  // Otherwise the HTTP answer (404: not /edge/<valid id>; 426: not a WebSocket
  // upgrade) and why.
  boost::beast::http::status refusal = boost::beast::http::status::unknown;
  std::string why;
  bool ok() const { return refusal == boost::beast::http::status::unknown; }
};

// Accepts a WebSocket upgrade of /edge/<valid id>; anything else gets a
// refusal.
UpgradeVerdict JudgeUpgradeRequest(const UpgradeRequest &req);

}  // namespace kvasir::relay
