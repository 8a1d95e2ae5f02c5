#include "node/relay_dial.h"

#include <span>

#include "base/log.h"
#include "relay/edge_token.h"

namespace kvasir::node {

ring::DialHook RelayEdgeHook(std::string url, relay::Role role, relay::RelayDialOptions dial,
                             std::shared_ptr<const std::string> secret) {
  return [url = std::move(url), role, dial = std::move(dial),
          secret = std::move(secret)](const std::function<bool()>& cancelled) {
    relay::RelayDialOptions o = dial;
    o.cancelled = cancelled;
    std::span<const uint8_t> key;
    if (secret != nullptr) {
      key = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(secret->data()),
                                     secret->size());
    }
    return relay::DialRelayEdge(url, role, key, o);
  };
}

Status CheckRelayEdges(const RelayEdges& edges) {
  for (auto [flag, url] :
       {std::pair{"--pred-via", &edges.pred_via}, {"--next-via", &edges.next_via}}) {
    if (url->empty()) continue;
    if (auto u = relay::ParseRelayEdgeUrl(*url); !u.ok()) {
      return Error("{}: {}", flag, u.status().message());
    }
  }
  return Status::Ok();
}

Status ApplyRelayEdges(const RelayEdges& edges, ring::StageOptions* opt) {
  KV_RETURN_IF_ERROR(CheckRelayEdges(edges));
  if (edges.pred_via.empty() && edges.next_via.empty()) return Status::Ok();
  auto secret = std::make_shared<std::string>();
  if (!edges.secret_file.empty()) {
    KV_ASSIGN_OR_RETURN(*secret, relay::ReadSecretFile(edges.secret_file));
  } else {
    KV_LOG_WARN(
        "no --relay-secret-file: edge tokens are empty, which only a relay without "
        "--secret-file accepts");
  }
  relay::RelayDialOptions dial;
  dial.ca_file = edges.ca_file;
  if (!edges.next_via.empty()) {
    opt->dial_next = RelayEdgeHook(edges.next_via, relay::Role::kPredecessorSide, dial, secret);
    opt->next_via = edges.next_via;
  }
  if (!edges.pred_via.empty()) {
    opt->dial_pred = RelayEdgeHook(edges.pred_via, relay::Role::kSuccessorSide, dial, secret);
    opt->pred_via = edges.pred_via;
  }
  return Status::Ok();
}

}  // namespace kvasir::node
