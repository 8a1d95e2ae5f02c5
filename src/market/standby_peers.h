// What a heartbeat reply says about standbys (docs/MARKET.md, "Standbys"), as `kvasir join`'s
// stage needs it: the standbys of the successor's window to dial and accept, and the keys of the
// predecessor's window's standbys to accept.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "relay/ws_stream.h"
#include "ring/stage.h"

namespace kvasir::market {

struct NeighbourStandbys {
  std::vector<ring::StandbyPeer> next;
  std::vector<ring::StandbyPeer> pred;
  std::set<int64_t> next_claims, pred_claims;  // their claim ids
  bool operator==(const NeighbourStandbys& o) const {
    return next_claims == o.next_claims && pred_claims == o.pred_claims;
  }
};

// A dial hook for a neighbour listed with `via` and `token` (through the relay), as `role`.
Result<ring::DialHook> RelayDialHook(const nlohmann::json& peer, relay::Role role,
                                     const std::string& ca_file);

// The heartbeat reply's "next_standbys" and "pred_standbys" (absent: none). A malformed entry is
// an error naming it.
Result<NeighbourStandbys> StandbysFromBeat(const nlohmann::json& beat, const std::string& ca_file);

}  // namespace kvasir::market
