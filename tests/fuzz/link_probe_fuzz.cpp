// libFuzzer target: arbitrary bytes from a peer into both sides of the link probe. Nothing may
// crash or hang; a session needs a well-formed hello, and a client's measurement is only
// reported when every answer it waited for arrived in order.
// Input layout: byte 0 selects the side (even: server, odd: client); byte 1 the piece size
// (1..64) in which the peer's bytes arrive; the rest is what the peer sends.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "ring/link_probe.h"
#include "scripted_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvasir;
  if (size < 2) return 0;
  const bool client = (data[0] & 1) != 0;
  const size_t chunk = 1 + data[1] % 64;
  std::span<const uint8_t> rest(data + 2, size - 2);
  fuzzing::ScriptedStream stream(rest, chunk);
  if (client) {
    ring::LinkProbeOptions o;
    o.pings = 2;
    o.bytes = 4096;
    o.io_timeout_ms = 200;
    auto m = ring::ProbeLink(stream, o);
    // Hello (8), then 3 pongs, an ack and a bye of 16 bytes each: less cannot measure.
    if (m.ok() && rest.size() < 8 + 5 * 16) std::abort();
  } else {
    auto s = ring::ServeLinkProbeSession(stream, 200);
    if (s.ok() && rest.size() < 8 + 16) std::abort();  // hello, then at least a bye
  }
  return 0;
}
