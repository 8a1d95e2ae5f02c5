// The dial hooks of a stage whose links go through a relay (docs/RELAY.md): one builder for the
// edges `kvasir stage --pred-via/--next-via` names and for those the market hands a joiner.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "relay/ws_stream.h"
#include "ring/stage.h"

namespace kvasir::node {

// A hook that dials the relay edge `url` (ws[s]://RELAY/edge/ID) as `role`, with `dial`'s CA file,
// timeouts and token; without a token, the edge token is made from `secret` (the ring secret;
// null or empty: an empty token, which only a relay without a secret accepts). Each dial copies
// `dial` and adds the stage's cancellation to it.
ring::DialHook RelayEdgeHook(std::string url, relay::Role role, relay::RelayDialOptions dial,
                             std::shared_ptr<const std::string> secret = nullptr);

// The relayed links of a stage (`kvasir stage --pred-via/--next-via`), URLs unchecked.
struct RelayEdges {
  std::string pred_via, next_via;  // empty: that link is direct
  std::string secret_file;         // the ring secret the edge tokens are made with (or empty)
  std::string ca_file;             // PEM certificates to trust for wss://
};

// Checks the URLs: an error names the flag (--pred-via, --next-via) and what is wrong.
Status CheckRelayEdges(const RelayEdges& edges);

// Checks the URLs as CheckRelayEdges does, reads the secret file, and sets opt's dial hooks and
// *_via for the relayed links. Across the edge to its successor a stage is the predecessor side,
// and the reverse. Nothing is dialed here.
Status ApplyRelayEdges(const RelayEdges& edges, ring::StageOptions* opt);

}  // namespace kvasir::node
