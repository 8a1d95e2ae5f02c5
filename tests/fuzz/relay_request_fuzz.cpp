// libFuzzer target: what reaches the relay before any token, as parsing code of ours sees it. The
// bytes are parsed as an HTTP request with the relay's limits and judged by JudgeUpgradeRequest;
// the same bytes go through ParseEdgePath (as a request target) and ParseRelayEdgeUrl (as a
// stage's --next-via). Invariants: an accepted request is a WebSocket upgrade of /edge/<id> with a
// valid id; an accepted path or URL names a valid id that it ends with.
#include <utility>  // before Asio (Boost 1.74 under GCC 12, C++20)

#include <boost/beast/http/parser.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "relay/edge_token.h"
#include "relay/upgrade_request.h"
#include "relay/ws_stream.h"

namespace http = boost::beast::http;
using namespace kvasir::relay;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  http::request_parser<http::empty_body> parser;
  parser.header_limit(kMaxRequestHeaderBytes);
  parser.body_limit(0);
  parser.eager(true);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(data, size), ec);
  if (!ec && parser.is_header_done()) {
    const UpgradeRequest& req = parser.get();
    const UpgradeVerdict v = JudgeUpgradeRequest(req);
    if (v.ok()) {
      if (!ValidEdgeId(v.edge_id) || !boost::beast::websocket::is_upgrade(req)) std::abort();
      if (std::string_view(req.target().data(), req.target().size()) != "/edge/" + v.edge_id) {
        std::abort();
      }
    } else if (v.refusal != http::status::not_found &&
               v.refusal != http::status::upgrade_required) {
      std::abort();
    }
  }

  auto id = ParseEdgePath(text);
  if (id.ok() && (!ValidEdgeId(*id) || text != "/edge/" + *id)) std::abort();

  auto url = ParseRelayEdgeUrl(std::string(text));
  if (url.ok() && (!ValidEdgeId(url->edge_id) || url->url.target != "/edge/" + url->edge_id)) {
    std::abort();
  }
  return 0;
}
