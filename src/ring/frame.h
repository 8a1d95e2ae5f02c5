// Framing of the ring protocol (docs/PROTOCOL.md, "Framing"): a 16-byte FrameHeader followed by
// `length` payload bytes. This layer knows message ids only as numbers to range-check; what a
// payload means is messages.h's business, and how bytes travel is the transport's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "ring/byte_budget.h"
#include "ring/wire.h"

namespace kvasir::ring {

// One received frame: its message id (already checked to be in 1..kMaxMsgType) and its payload.
struct Frame {
  uint16_t type = 0;
  std::vector<uint8_t> payload;
};

// Validates a received header: magic, type in 1..kMaxMsgType, length <= max_payload. The flags and
// reserved fields are ignored, as the specification asks.
Status CheckFrameHeader(const wire::FrameHeader& h, uint32_t max_payload = wire::kMaxPayload);

// Header (flags and reserved zero) followed by `payload`, ready to write to a link. The payload
// must fit the protocol limit (kMaxPayload); a larger one is a bug of the caller.
std::vector<uint8_t> EncodeFrame(wire::MsgType type, std::span<const uint8_t> payload);

// Reads the header at the start of `bytes` (at least sizeof(FrameHeader) of them).
wire::FrameHeader LoadFrameHeader(std::span<const uint8_t> bytes);

// Incremental decoder for one link's byte stream. Feed() bytes as they arrive, then call Next()
// until it yields no frame. A malformed header puts the decoder in a sticky error state: Next()
// returns that error from then on and Feed() discards its input, since the stream cannot be
// resynchronised. Memory: the decoder holds the bytes fed but not yet returned, in a buffer that
// grows with them (at most twice what it holds), never to the length a header announced. With a
// ByteAccount (a client link) the buffer is charged to it and freed whenever it empties; a charge
// that fails is a sticky error with code kTooLarge. Without one, up to 1 MiB is kept for reuse.
// Not thread-safe.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_payload = wire::kMaxPayload,
                        std::shared_ptr<ByteAccount> account = nullptr);
  ~FrameDecoder();
  FrameDecoder(const FrameDecoder&) = delete;
  FrameDecoder& operator=(const FrameDecoder&) = delete;

  void Feed(std::span<const uint8_t> bytes);

  // A complete frame, std::nullopt when more bytes are needed, or the stream's error.
  Result<std::optional<Frame>> Next();

  bool failed() const { return !error_.ok(); }
  // Bytes fed and not yet returned as frames.
  size_t buffered() const { return buf_.size() - start_; }
  uint32_t max_payload() const { return max_payload_; }

 private:
  void Fail(Status s);
  // Empties the buffer; frees it when charged or large.
  void Reset();

  uint32_t max_payload_;
  std::shared_ptr<ByteAccount> account_;
  std::vector<uint8_t> buf_;  // [start_, size) are pending stream bytes
  size_t start_ = 0;
  Status error_;
};

}  // namespace kvasir::ring
