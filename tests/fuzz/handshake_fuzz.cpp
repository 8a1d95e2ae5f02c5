// libFuzzer target: arbitrary bytes from a peer into both sides of the link handshake and into the
// encrypted stream's reader. Nothing may crash, hang or succeed without the proofs: a handshake fed
// random bytes must fail (the fuzzer cannot forge a signature or MAC), and SecureStream must refuse
// every record it cannot open.
// Input layout: byte 0 selects the side (0 responder, 1 initiator as stage, 2 initiator as client,
// 3 SecureStream reader); the rest is what the peer "sends", in chunks of byte 1 (1..64) bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "ring/handshake.h"
#include "ring/secure_stream.h"
#include "scripted_stream.h"

namespace {

using namespace kvasir;

using fuzzing::ScriptedStream;

const ring::LinkAuth& StageAuth() {
  static const ring::LinkAuth a = [] {
    ring::LinkAuth x;
    x.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
    x.ring_secret = "fuzz-ring-secret-0123456789";
    return x;
  }();
  return a;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int side = data[0] % 4;
  const size_t chunk = 1 + data[1] % 64;
  std::span<const uint8_t> rest(data + 2, size - 2);
  ScriptedStream stream(rest, chunk);
  if (side == 0) {
    ring::LinkAuth clients;
    clients.client_secret = "fuzz-client-secret-01234";
    auto r = ring::HandshakeRespond(stream, StageAuth(), clients);
    if (r.ok()) std::abort();  // random bytes cannot prove the client secret or the ring secret
  } else if (side == 1 || side == 2) {
    auto r = ring::HandshakeInitiate(
        stream, side == 1 ? wire::Role::kStage : wire::Role::kClient, StageAuth());
    if (r.ok()) std::abort();
  } else {
    ring::SessionKey k{};
    auto inner = std::make_unique<ScriptedStream>(rest, chunk);
    ring::SecureStream s(std::move(inner), k, k, 1 << 16);
    uint8_t buf[512];
    for (int i = 0; i < 10000; ++i) {
      auto n = s.ReadSome(buf);
      if (!n.ok() || *n == 0) break;
    }
  }
  return 0;
}
