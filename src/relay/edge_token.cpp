#include "relay/edge_token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/check.h"
#include "base/secret_file.h"

namespace kvasir::relay {

bool ValidEdgeId(std::string_view id) {
  if (id.empty() || id.size() > kMaxEdgeIdChars) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

EdgeToken MakeEdgeToken(std::span<const uint8_t> secret, std::string_view edge_id, Role role) {
  std::string msg = "kvasir-relay-v1";
  msg.push_back('\0');
  msg.append(edge_id);
  msg.push_back('\0');
  msg.push_back(static_cast<char>(role));
  EdgeToken out{};
  unsigned int len = 0;
  static const uint8_t kEmpty = 0;
  const uint8_t* key = secret.empty() ? &kEmpty : secret.data();
  KV_CHECK(HMAC(EVP_sha256(), key, static_cast<int>(secret.size()),
                reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(),
                &len) != nullptr &&
           len == out.size());
  return out;
}

bool TokensEqual(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string EdgeHello(std::span<const uint8_t> secret, std::string_view edge_id, Role role) {
  std::string hello(kHelloBytes, '\0');
  hello[0] = static_cast<char>(role);
  if (!secret.empty()) {
    const EdgeToken t = MakeEdgeToken(secret, edge_id, role);
    std::memcpy(hello.data() + 1, t.data(), t.size());
  }
  return hello;
}

Result<std::string> ParseEdgePath(std::string_view target) {
  constexpr std::string_view kPrefix = "/edge/";
  if (target.substr(0, kPrefix.size()) != kPrefix) {
    return Error("{}: a relay edge has the path /edge/<edge-id>", target);
  }
  const std::string_view id = target.substr(kPrefix.size());
  if (!ValidEdgeId(id)) {
    return Error("{}: '{}' is not an edge id (1 to {} characters from A-Z a-z 0-9 . _ -)", target,
                 id, kMaxEdgeIdChars);
  }
  return std::string(id);
}

Result<Role> CheckEdgeHello(std::span<const uint8_t> secret, std::string_view edge_id,
                            std::span<const uint8_t> message, bool binary) {
  if (!binary) return Error("bad preamble: a text first message (it must be binary)");
  if (message.size() != kHelloBytes) {
    return Error("bad preamble: a first message of {} bytes (it must be {})", message.size(),
                 kHelloBytes);
  }
  const uint8_t first = message[0];
  if (first != static_cast<uint8_t>(Role::kPredecessorSide) &&
      first != static_cast<uint8_t>(Role::kSuccessorSide)) {
    return Error("bad preamble: role byte 0x{:02x} (0x01 or 0x02 expected)", first);
  }
  const Role role = static_cast<Role>(first);
  if (!secret.empty()) {
    const EdgeToken want = MakeEdgeToken(secret, edge_id, role);
    if (!TokensEqual(want, message.subspan(1))) {
      return Error(StatusCode::kUnauthenticated, "bad token for edge {} ({})", edge_id,
                   RoleName(role));
    }
  }
  return role;
}

Result<std::string> ReadSecretFile(const std::string& path) {
  return kvasir::ReadSecretFile(path, "ring secret");
}

const char* RoleName(Role role) {
  return role == Role::kPredecessorSide ? "predecessor side" : "successor side";
}

}  // namespace kvasir::relay
