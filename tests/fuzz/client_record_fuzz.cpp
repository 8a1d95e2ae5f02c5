// libFuzzer target: what an anonymous client's bytes can make a head hold. Records sealed with the
// link's key (so the fuzzer reaches the frame decoder and the message codec) and raw bytes (lying
// lengths, truncated records) go through SecureStream and FrameDecoder charged to a small
// ByteBudget, as on a client link. Nothing may crash; the budget is never exceeded; what the
// client's account holds stays within a small multiple of the bytes that arrived (buffers grow
// with the bytes, never with a length header's promise); and everything is given back at the end.
// Input layout: byte 0: the reader's chunk size (1..128); byte 1: the budget (1 KiB << (b & 7))
// and the record limit (256 << (b >> 4 & 7)); then operations, each [op][u16 length][bytes]:
// op % 3 == 0 a sealed record of those bytes, 1 the bytes raw, 2 a sealed record holding a frame
// whose type is the first byte and whose payload is the rest.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "ring/byte_budget.h"
#include "ring/frame.h"
#include "ring/messages.h"
#include "ring/secure_stream.h"
#include "scripted_stream.h"

namespace {

using namespace kvasir;

void Require(bool cond) {
  if (!cond) std::abort();
}

// Collects what a SecureStream writes.
class Sink final : public net::Stream {
 public:
  explicit Sink(std::vector<uint8_t>* out) : out_(out) {}
  Status WriteAll(std::span<const uint8_t> b) override {
    out_->insert(out_->end(), b.begin(), b.end());
    return Status::Ok();
  }
  Result<size_t> ReadSome(std::span<uint8_t>) override { return size_t{0}; }
  void Shutdown() override {}
  std::string peer() const override { return "sink"; }

 private:
  std::vector<uint8_t>* out_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t chunk = 1 + data[0] % 128;
  const size_t limit = size_t{1024} << (data[1] & 7);
  const size_t max_record = size_t{256} << ((data[1] >> 4) & 7);
  ring::SessionKey k_client{}, k_head{};
  k_client[0] = 1;
  k_head[0] = 2;

  // What the client sends.
  std::vector<uint8_t> wire;
  {
    ring::SecureStream writer(std::make_unique<Sink>(&wire), k_client, k_head, 1 << 20);
    size_t at = 2;
    while (at + 3 <= size) {
      const uint8_t op = data[at];
      const size_t len = std::min<size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
      std::span<const uint8_t> bytes(data + at + 3, len);
      at += 3 + len;
      if (op % 3 == 1) {
        wire.insert(wire.end(), bytes.begin(), bytes.end());
        continue;
      }
      if (op % 3 == 2 && !bytes.empty()) {
        wire::FrameHeader h{wire::kMagic, bytes[0], 0, static_cast<uint32_t>(len - 1), 0};
        std::vector<uint8_t> frame(sizeof(h) + len - 1);
        std::memcpy(frame.data(), &h, sizeof(h));
        if (len > 1) std::memcpy(frame.data() + sizeof(h), bytes.data() + 1, len - 1);
        (void)writer.WriteAll(frame);
        continue;
      }
      (void)writer.WriteAll(bytes);
    }
  }

  // The head's side of a client link.
  auto budget = ring::ByteBudget::Create(limit);
  bool dropped = false;
  auto account = budget->Open([&](size_t) { dropped = true; });
  {
    auto script = std::make_unique<fuzzing::ScriptedStream>(wire, chunk);
    const fuzzing::ScriptedStream* seen = script.get();
    ring::SecureStream reader(std::move(script), k_head, k_client, max_record, account);
    ring::FrameDecoder decoder(static_cast<uint32_t>(max_record), account);
    uint8_t buf[512];
    for (int i = 0; i < 100000; ++i) {
      auto n = reader.ReadSome(buf);
      Require(budget->held() <= limit);
      Require(account->held() <= 6 * seen->consumed() + 16 * 1024);
      if (!n.ok() || *n == 0) break;
      decoder.Feed(std::span<const uint8_t>(buf, *n));
      while (true) {
        auto next = decoder.Next();
        if (!next.ok() || !next->has_value()) break;
        Require((**next).payload.size() <= max_record);
        (void)ring::DecodeMessage(**next);
      }
      Require(budget->held() <= limit);
    }
  }
  Require(!dropped);  // a lone account is never dropped for itself
  Require(account->held() == 0 && budget->held() == 0);
  return 0;
}
