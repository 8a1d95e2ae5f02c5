// libFuzzer target: arbitrary bytes through the ring's FrameDecoder (1 MiB payload limit) and
// DecodeMessage. Whatever decodes must be encodable again, and its encoding must decode to the
// same bytes once more (the codec is idempotent after one pass drops reserved fields).
// Input layout: byte 0 selects the mode.
//   bit 0 clear: byte 0 >> 1 sets the chunk size (1..128) in which the rest is fed as a stream;
//   bit 0 set:   byte 1 is a message type and the rest is its payload, given to DecodeMessage.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "ring/frame.h"
#include "ring/messages.h"

namespace {

using kvasir::ring::Frame;
using kvasir::ring::FrameDecoder;
using kvasir::ring::Message;

constexpr uint32_t kMaxPayload = 1u << 20;

void Require(bool cond) {
  if (!cond) std::abort();
}

void CheckFrame(const Frame& frame) {
  auto decoded = kvasir::ring::DecodeMessage(frame);
  if (!decoded.ok()) {
    Require(!decoded.status().message().empty());
    return;
  }
  const Message& m = *decoded;
  (void)kvasir::ring::MessageName(m);
  Require(kvasir::ring::CheckEncodable(m).ok());
  if (const auto* h = std::get_if<kvasir::ring::HiddenMsg>(&m)) {
    std::vector<float> rows;
    kvasir::ring::HiddenToF32(*h, &rows);
    Require(rows.size() == size_t{h->n_tokens} * h->n_embd);
  }
  const std::vector<uint8_t> once = kvasir::ring::EncodeMessage(m);
  FrameDecoder again(kMaxPayload);
  again.Feed(once);
  auto next = again.Next();
  Require(next.ok() && next->has_value() && again.buffered() == 0);
  Require((**next).type == frame.type);
  auto redecoded = kvasir::ring::DecodeMessage(**next);
  Require(redecoded.ok());
  Require(kvasir::ring::EncodeMessage(*redecoded) == once);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::span<const uint8_t> rest(data + 1, size - 1);
  if (mode & 1) {
    if (rest.empty()) return 0;
    Frame frame{rest[0], std::vector<uint8_t>(rest.begin() + 1, rest.end())};
    CheckFrame(frame);
    return 0;
  }
  const size_t chunk = static_cast<size_t>(mode >> 1) + 1;
  FrameDecoder decoder(kMaxPayload);
  size_t fed = 0;
  while (true) {
    auto next = decoder.Next();
    if (!next.ok()) {
      Require(decoder.failed() && decoder.buffered() == 0);
      break;
    }
    if (next->has_value()) {
      Require((**next).payload.size() <= kMaxPayload);
      CheckFrame(**next);
      continue;
    }
    if (fed == rest.size()) break;
    const size_t n = std::min(chunk, rest.size() - fed);
    decoder.Feed(rest.subspan(fed, n));
    fed += n;
  }
  return 0;
}
