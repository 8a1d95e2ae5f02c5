// libFuzzer target: arbitrary bytes as a RECEIPT payload from a peer. Nothing may crash; what
// parses encodes back to exactly the input, and its signatures are checked (VerifyReceipt) without
// harm. A receipt that verifies stays verified after one more line is appended, and a receipt
// with one of its signed bytes flipped never verifies.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <span>
#include <vector>

#include "ring/receipt.h"

namespace {

void Require(bool cond) {
  if (!cond) std::abort();
}

const kvasir::ring::NodeKey& Key() {
  static const kvasir::ring::NodeKey key = [] {
    std::array<uint8_t, 32> seed{};
    seed[0] = 7;
    return kvasir::ring::NodeKey::FromSeed(seed);
  }();
  return key;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvasir;
  std::span<const uint8_t> payload(data, size);
  auto parsed = ring::ParseReceipt(payload);
  if (!parsed.ok()) {
    Require(!parsed.status().message().empty());
    return 0;
  }
  ring::Receipt& r = *parsed;
  Require(!r.lines.empty() && r.lines.size() <= wire::kMaxReceiptLines);
  const std::vector<uint8_t> again = ring::EncodeReceipt(r);
  Require(again.size() == size && std::equal(again.begin(), again.end(), data));
  (void)ring::ReceiptIdHex(r);
  const Status verified = ring::VerifyReceipt(r);
  if (!verified.ok()) {
    Require(!verified.message().empty());
    return 0;
  }
  // Rarely reached from random bytes; the seeds hold receipts that verify.
  ring::Receipt tampered = r;
  tampered.lines.back().tokens ^= 1;
  Require(!ring::VerifyReceipt(tampered).ok());
  const uint32_t last = r.lines.back().last;
  if (r.lines.size() < wire::kMaxReceiptLines && last < std::numeric_limits<uint32_t>::max()) {
    ring::AppendReceiptLine(&r, Key(), last, last + 1, 1, ring::Digest{});
    Require(ring::VerifyReceipt(r).ok());
    auto reparsed = ring::ParseReceipt(ring::EncodeReceipt(r));
    Require(reparsed.ok() && ring::VerifyReceipt(*reparsed).ok());
  }
  return 0;
}
