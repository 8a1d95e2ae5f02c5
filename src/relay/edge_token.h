// Edge ids, roles and tokens of the relay (docs/RELAY.md). Shared by the relay server and the
// stages that dial it.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "base/secret_file.h"  // kMinSecretBytes: the shortest ring secret
#include "base/status.h"

namespace kvasir::relay {

// The role preamble: the first byte of an end's first message.
enum class Role : uint8_t {
  kPredecessorSide = 0x01,  // sends into the edge (the stage whose successor is across it)
  kSuccessorSide = 0x02,    // receives from the edge (the stage whose predecessor is across it)
};

inline constexpr size_t kTokenBytes = 32;
inline constexpr size_t kHelloBytes = 1 + kTokenBytes;  // preamble + token
inline constexpr size_t kMaxEdgeIdChars = 64;

using EdgeToken = std::array<uint8_t, kTokenBytes>;

// 1..64 characters from A-Z a-z 0-9 . _ -
bool ValidEdgeId(std::string_view id);
// HMAC-SHA256(secret, "kvasir-relay-v1" 0x00 id 0x00 role).
EdgeToken MakeEdgeToken(std::span<const uint8_t> secret, std::string_view edge_id, Role role);
// Constant-time comparison.
bool TokensEqual(std::span<const uint8_t> a, std::span<const uint8_t> b);
// The first message an end sends: role byte then token (a zero token when `secret` is empty).
std::string EdgeHello(std::span<const uint8_t> secret, std::string_view edge_id, Role role);

// The edge id of a request target "/edge/<id>". Errors name the target and the rule it breaks.
Result<std::string> ParseEdgePath(std::string_view target);

// Checks an end's first message on edge `edge_id` (binary or text as the WebSocket frame said):
// it must be binary, exactly kHelloBytes long, start with a known role byte and, when `secret` is
// not empty, carry MakeEdgeToken(secret, edge_id, role). Returns the role. Errors: kInvalidInput
// ("bad preamble: ...") for the shape, kUnauthenticated ("bad token ...") for the token. Any bytes
// are safe to pass; nothing here aborts.
Result<Role> CheckEdgeHello(std::span<const uint8_t> secret, std::string_view edge_id,
                            std::span<const uint8_t> message, bool binary);

// Reads a ring secret file (kvasir::ReadSecretFile, base/secret_file.h: its bytes minus one
// trailing newline; at least 16 bytes). Errors name the file.
Result<std::string> ReadSecretFile(const std::string& path);

// "predecessor side" / "successor side".
const char* RoleName(Role role);

}  // namespace kvasir::relay
