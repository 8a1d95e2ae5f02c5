// The link handshake (docs/PROTOCOL.md, "Handshake"): before any other frame, the two ends of a
// link exchange ephemeral X25519 keys (libsodium crypto_kx), prove who they are over the
// transcript (an Ed25519 signature by the node key, and/or an HMAC-SHA256 keyed with the ring
// secret or the client secret), and derive one key per direction for the encrypted stream
// (ring/secure_stream.h). The initiator is the upstream end: a predecessor, or a client.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "net/stream.h"
#include "ring/node_key.h"
#include "ring/wire.h"

namespace kvasir::ring {

using SessionKey = std::array<uint8_t, 32>;

// What one end proves and what it demands. Secrets are raw bytes (ReadSecretFile's result).
struct LinkAuth {
  std::shared_ptr<const NodeKey> key;  // signs the transcript; required of stages and heads
  std::string ring_secret;             // when set: prove it, and demand it of stage peers
  std::optional<PublicKey> peer_key;   // when set: the peer must sign with exactly this key
  // ... or with a key this accepts (the neighbour's standbys, which may change at any time:
  // called during the handshake, from the thread that runs it).
  std::function<bool(const PublicKey&)> also_accept;
  std::string client_secret;           // initiator client: prove it; responder: demand it of clients
  bool insecure = false;               // accept a stage peer (or a head) with no proof at all
};

struct HandshakeResult {
  wire::Role peer_role = wire::Role::kStage;  // the initiator's role (a responder is a stage)
  std::optional<PublicKey> peer_key;          // the key the peer signed with, if it signed
  bool peer_has_ring_secret = false;          // the peer proved the ring secret
  SessionKey tx{};                            // this end -> peer
  SessionKey rx{};                            // peer -> this end
  // "node 3fa91c07" (or "anonymous client"), for logs.
  std::string peer_desc;
};

// Runs the initiator's side over `stream` (nothing else may use it meanwhile). `role` is kStage
// for a predecessor, kClient for a client. On a failed proof this end sends ERROR
// kUnauthenticated naming why and returns an error with StatusCode::kUnauthenticated; a refusal
// from the peer comes back as an error carrying its message. The caller bounds the time (a
// DeadlineGuard that shuts the stream down).
Result<HandshakeResult> HandshakeInitiate(net::Stream& stream, wire::Role role,
                                          const LinkAuth& auth);

// The responder's side: `stage_auth` applies when the initiator says it is a stage,
// `client_auth` when it says it is a client (only its client_secret is used).
Result<HandshakeResult> HandshakeRespond(net::Stream& stream, const LinkAuth& stage_auth,
                                         const LinkAuth& client_auth);

// ---- The construction, exposed for known-answer tests ------------------------------------------

// BLAKE2b-256 of `prev` (empty for the first step) || `message`.
std::array<uint8_t, 32> TranscriptHash(std::span<const uint8_t> prev,
                                       std::span<const uint8_t> message);
// The bytes a proof covers: `label` ("kvasir link v2 responder" / "... initiator") || hash.
std::vector<uint8_t> ProofInput(std::string_view label, std::span<const uint8_t, 32> hash);
// HMAC-SHA256(secret, data).
std::array<uint8_t, 32> HmacSha256(std::string_view secret, std::span<const uint8_t> data);
// BLAKE2b-256 keyed with a crypto_kx session key over the final transcript hash.
SessionKey DeriveKey(const SessionKey& kx_key, std::span<const uint8_t, 32> transcript);

}  // namespace kvasir::ring
