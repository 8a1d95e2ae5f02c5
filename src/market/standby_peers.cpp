#include "market/standby_peers.h"

#include <algorithm>

#include "market/signed_request.h"
#include "node/relay_dial.h"

namespace kvasir::market {

using nlohmann::json;

Result<ring::DialHook> RelayDialHook(const json& peer, relay::Role role,
                                     const std::string& ca_file) {
  const std::string via = peer.at("via").get<std::string>();
  KV_ASSIGN_OR_RETURN(auto edge, relay::ParseRelayEdgeUrl(via));
  (void)edge;
  KV_ASSIGN_OR_RETURN(std::string token,
                      FromHex(peer.at("token").get<std::string>(), relay::kTokenBytes));
  relay::RelayDialOptions dial;
  dial.ca_file = ca_file;
  dial.token.emplace();
  std::copy(token.begin(), token.end(), reinterpret_cast<char*>(dial.token->data()));
  return node::RelayEdgeHook(via, role, std::move(dial));
}

Result<NeighbourStandbys> StandbysFromBeat(const json& beat, const std::string& ca_file) {
  NeighbourStandbys out;
  try {
    if (auto it = beat.find("next_standbys"); it != beat.end()) {
      for (const json& p : *it) {
        ring::StandbyPeer peer;
        KV_ASSIGN_OR_RETURN(peer.key, ring::ParsePublicKey(p.at("node").get<std::string>()));
        if (p.contains("via")) {
          KV_ASSIGN_OR_RETURN(peer.dial, RelayDialHook(p, relay::Role::kPredecessorSide, ca_file));
          peer.via = p.at("via").get<std::string>();
        } else {
          peer.address = p.at("address").get<std::string>();
        }
        out.next_claims.insert(p.at("claim").get<int64_t>());
        out.next.push_back(std::move(peer));
      }
    }
    if (auto it = beat.find("pred_standbys"); it != beat.end()) {
      for (const json& p : *it) {
        ring::StandbyPeer peer;
        KV_ASSIGN_OR_RETURN(peer.key, ring::ParsePublicKey(p.at("node").get<std::string>()));
        if (p.contains("via")) {
          KV_ASSIGN_OR_RETURN(peer.dial, RelayDialHook(p, relay::Role::kSuccessorSide, ca_file));
          peer.via = p.at("via").get<std::string>();
        }
        out.pred_claims.insert(p.at("claim").get<int64_t>());
        out.pred.push_back(std::move(peer));
      }
    }
  } catch (const std::exception& e) {
    return Error("the market's heartbeat answer lists malformed standbys: {}", e.what());
  }
  return out;
}

}  // namespace kvasir::market
