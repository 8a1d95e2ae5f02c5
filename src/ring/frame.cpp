#include "ring/frame.h"

#include <bit>
#include <cstring>
#include <string>

#include "base/check.h"

namespace kvasir::ring {

static_assert(std::endian::native == std::endian::little,
              "the ring codec copies little-endian wire structs as they are");

namespace {

constexpr size_t kHeaderSize = sizeof(wire::FrameHeader);
constexpr size_t kKeepBuffer = 1 << 20;  // without an account, a larger empty buffer is freed

std::string LimitText(uint32_t limit) {
  if (limit >= (1u << 20) && limit % (1u << 20) == 0) {
    return fmt::format("{} MiB limit", limit >> 20);
  }
  return fmt::format("{}-byte limit", limit);
}

}  // namespace

Status CheckFrameHeader(const wire::FrameHeader& h, uint32_t max_payload) {
  if (h.magic != wire::kMagic) {
    return Error(
        "frame magic 0x{:08X} is not KVR1 (0x{:08X}): not a Kvasir ring peer or a "
        "desynchronised stream",
        h.magic, wire::kMagic);
  }
  if (h.type == 0 || h.type > wire::kMaxMsgType) {
    return Error("frame type {} is unknown (this build knows 1..{})", h.type, wire::kMaxMsgType);
  }
  if (h.length > max_payload) {
    return Error("{} frame length {} exceeds the {}", wire::MsgTypeName(h.type), h.length,
                 LimitText(max_payload));
  }
  return Status::Ok();
}

wire::FrameHeader LoadFrameHeader(std::span<const uint8_t> bytes) {
  KV_CHECK(bytes.size() >= kHeaderSize, "header needs {} bytes, have {}", kHeaderSize,
           bytes.size());
  wire::FrameHeader h;
  std::memcpy(&h, bytes.data(), kHeaderSize);
  return h;
}

std::vector<uint8_t> EncodeFrame(wire::MsgType type, std::span<const uint8_t> payload) {
  KV_CHECK(payload.size() <= wire::kMaxPayload, "{} payload of {} bytes exceeds kMaxPayload",
           wire::MsgTypeName(static_cast<uint16_t>(type)), payload.size());
  wire::FrameHeader h{};
  h.magic = wire::kMagic;
  h.type = static_cast<uint16_t>(type);
  h.length = static_cast<uint32_t>(payload.size());
  std::vector<uint8_t> out(kHeaderSize + payload.size());
  std::memcpy(out.data(), &h, kHeaderSize);
  if (!payload.empty()) std::memcpy(out.data() + kHeaderSize, payload.data(), payload.size());
  return out;
}

FrameDecoder::FrameDecoder(uint32_t max_payload, std::shared_ptr<ByteAccount> account)
    : max_payload_(max_payload), account_(std::move(account)) {}

FrameDecoder::~FrameDecoder() { FreeCharged(&buf_, account_.get()); }

void FrameDecoder::Fail(Status s) {
  error_ = std::move(s);
  buf_.clear();
  FreeCharged(&buf_, account_.get());
  start_ = 0;
}

void FrameDecoder::Reset() {
  buf_.clear();
  start_ = 0;
  if (account_ != nullptr || buf_.capacity() > kKeepBuffer) FreeCharged(&buf_, account_.get());
}

void FrameDecoder::Feed(std::span<const uint8_t> bytes) {
  if (failed() || bytes.empty()) return;
  if (buf_.size() + bytes.size() > buf_.capacity()) {
    if (start_ > 0) {
      buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(start_));
      start_ = 0;
    }
    const size_t need = buf_.size() + bytes.size();
    if (need > buf_.capacity() &&
        !ReserveCharged(&buf_, std::max(need, buf_.capacity() * 2), account_.get())) {
      return Fail(Error(StatusCode::kTooLarge,
                        "dropped: the stage's buffers for unauthenticated peers are full"));
    }
  }
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

Result<std::optional<Frame>> FrameDecoder::Next() {
  if (failed()) return error_;
  const size_t avail = buf_.size() - start_;
  if (avail < kHeaderSize) return std::optional<Frame>();
  const wire::FrameHeader h = LoadFrameHeader({buf_.data() + start_, avail});
  if (Status s = CheckFrameHeader(h, max_payload_); !s.ok()) {
    Fail(s);
    return error_;
  }
  const size_t total = kHeaderSize + size_t{h.length};
  // The buffer grows as the frame's bytes arrive (Feed), not here on the header's word.
  if (avail < total) return std::optional<Frame>();
  Frame frame;
  frame.type = h.type;
  const uint8_t* p = buf_.data() + start_ + kHeaderSize;
  frame.payload.assign(p, p + h.length);
  start_ += total;
  if (start_ == buf_.size()) {
    Reset();
  } else if (start_ >= buf_.size() / 2) {
    // Compact once the consumed prefix dominates, so the copying stays amortised O(1) per byte.
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(start_));
    start_ = 0;
  }
  return std::optional<Frame>(std::move(frame));
}

}  // namespace kvasir::ring
