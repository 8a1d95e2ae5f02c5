// libFuzzer target: an end's first message as the relay sees it, through CheckEdgeHello, with and
// without a ring secret. Input: byte 0 = flags (bit 0: the frame was binary, bit 1: the relay has
// a secret), byte 1 = edge id length, then the edge id, then the message. Invariants: an accepted
// message is the 33-byte binary hello, and with a secret exactly EdgeHello(secret, id, role); a
// refusal says "bad preamble" (invalid input) or "bad token" (unauthenticated, only with a
// secret); the hello a stage sends is always accepted.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

#include "relay/edge_token.h"

namespace {

using kvasir::StatusCode;
using namespace kvasir::relay;

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool binary = (data[0] & 1) != 0;
  const std::string_view secret = (data[0] & 2) != 0 ? "fuzz-ring-secret-0123456789" : "";
  const size_t id_len = std::min<size_t>(data[1], size - 2);
  const std::string_view id(reinterpret_cast<const char*>(data + 2), id_len);
  const std::span<const uint8_t> message(data + 2 + id_len, size - 2 - id_len);

  auto r = CheckEdgeHello(Bytes(secret), id, message, binary);
  if (r.ok()) {
    if (!binary || message.size() != kHelloBytes) std::abort();
    if (message[0] != static_cast<uint8_t>(*r)) std::abort();
    if (!secret.empty() &&
        EdgeHello(Bytes(secret), id, *r) !=
            std::string_view(reinterpret_cast<const char*>(message.data()), message.size())) {
      std::abort();
    }
  } else {
    const StatusCode code = r.status().code();
    const std::string& why = r.status().message();
    if (code == StatusCode::kUnauthenticated) {
      if (secret.empty() || why.find("bad token") == std::string::npos) std::abort();
    } else if (code != StatusCode::kInvalidInput || why.find("bad preamble") == std::string::npos) {
      std::abort();
    }
  }
  for (Role role : {Role::kPredecessorSide, Role::kSuccessorSide}) {
    const std::string hello = EdgeHello(Bytes(secret), id, role);
    auto ok = CheckEdgeHello(Bytes(secret), id, Bytes(hello), true);
    if (!ok.ok() || *ok != role) std::abort();
  }
  return 0;
}
