#include "relay/upgrade_request.h"

#include <boost/beast/websocket/rfc6455.hpp>

#include "relay/edge_token.h"

namespace kvasir::relay {

namespace http = boost::beast::http;

UpgradeVerdict JudgeUpgradeRequest(const UpgradeRequest &req) {
  UpgradeVerdict v;
  Result<std::string> id =
      ParseEdgePath(std::string_view(req.target().data(), req.target().size()));
  if (!id.ok()) {
    v.refusal = http::status::not_found;
    v.why =
        "no such path: use /edge/<id> with an id of 1-64 characters A-Z "
        "a-z 0-9 . _ -";
    return v;
  }
  if (!boost::beast::websocket::is_upgrade(req)) {
    v.refusal = http::status::upgrade_required;
    v.why = "this is a WebSocket relay endpoint";
    return v;
  }
  v.edge_id = std::move(id).value();
  return v;
}

}  // namespace kvasir::relay
