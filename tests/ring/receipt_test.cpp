// Contribution receipts alone (ring/receipt.h): the RECEIPT payload's encoding, what the parser
// refuses, what the signatures catch, and a known-answer vector from fixed keys.
#include "ring/receipt.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ring/messages.h"
#include "ring/recent_map.h"

namespace kvasir::ring {
namespace {

NodeKey Key(int i) {
  std::array<uint8_t, 32> seed;
  for (size_t j = 0; j < seed.size(); ++j) seed[j] = static_cast<uint8_t>(i * 32 + j);
  return NodeKey::FromSeed(seed);
}

// A stand-in for line i's row commitment: bytes 0x80 + 0x20 i + j.
Digest RootOf(int i) {
  Digest d;
  for (size_t j = 0; j < d.size(); ++j) d[j] = static_cast<uint8_t>(0x80 + 0x20 * i + j);
  return d;
}

// A receipt of a 5-layer model on three stages ([0,2), [2,4), [4,5)), 20 rows each, signed by
// the keys of seeds 0, 1, 2, committing to RootOf(0, 1, 2).
Receipt ThreeLines() {
  Receipt r;
  for (size_t i = 0; i < 16; ++i) {
    r.id[i] = static_cast<uint8_t>(i);
    r.model_id[i] = static_cast<uint8_t>(0xA0 + i);
  }
  r.session = 7;
  AppendReceiptLine(&r, Key(0), 0, 2, 20, RootOf(0));
  AppendReceiptLine(&r, Key(1), 2, 4, 20, RootOf(1));
  AppendReceiptLine(&r, Key(2), 4, 5, 20, RootOf(2));
  return r;
}

std::string Hex(std::span<const uint8_t> bytes) {
  std::string s;
  for (uint8_t b : bytes) s += fmt::format("{:02x}", b);
  return s;
}

std::string ParseError(const std::vector<uint8_t>& payload) {
  auto r = ParseReceipt(payload);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "(parsed)" : r.status().message();
}

std::string VerifyError(const Receipt& r) {
  Status s = VerifyReceipt(r);
  return s.ok() ? "(verified)" : s.message();
}

std::string Node(int i) { return ShortKey(Key(i).public_key()); }

TEST(ReceiptTest, EncodeParseRoundTrip) {
  const Receipt r = ThreeLines();
  const std::vector<uint8_t> bytes = EncodeReceipt(r);
  ASSERT_EQ(bytes.size(), 48u + 3 * 152u);
  auto back = ParseReceipt(bytes);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->id, r.id);
  EXPECT_EQ(back->model_id, r.model_id);
  EXPECT_EQ(back->session, 7u);
  ASSERT_EQ(back->lines.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back->lines[i].node, Key(static_cast<int>(i)).public_key());
    EXPECT_EQ(back->lines[i].first, r.lines[i].first);
    EXPECT_EQ(back->lines[i].last, r.lines[i].last);
    EXPECT_EQ(back->lines[i].tokens, 20u);
    EXPECT_EQ(back->lines[i].rows_root, RootOf(static_cast<int>(i)));
    EXPECT_EQ(back->lines[i].signature, r.lines[i].signature);
  }
  EXPECT_EQ(EncodeReceipt(*back), bytes);
  EXPECT_TRUE(VerifyReceipt(*back).ok());
  EXPECT_EQ(ReceiptIdHex(r), "000102030405060708090a0b0c0d0e0f");

  // The RECEIPT frame carries the payload as it is, whatever it holds: the stage parses it.
  for (const std::vector<uint8_t>& payload : {bytes, std::vector<uint8_t>{1, 2, 3}}) {
    const std::vector<uint8_t> frame = EncodeMessage(ReceiptMsg{payload});
    ASSERT_EQ(frame.size(), sizeof(wire::FrameHeader) + payload.size());
    EXPECT_EQ(frame[4], 13);  // the message id
    auto m = DecodeMessage(Frame{13, std::vector<uint8_t>(frame.begin() + 16, frame.end())});
    ASSERT_TRUE(m.ok()) << m.status().message();
    ASSERT_TRUE(std::holds_alternative<ReceiptMsg>(*m));
    EXPECT_EQ(std::get<ReceiptMsg>(*m).payload, payload);
    EXPECT_EQ(MessageType(*m), wire::MsgType::kReceipt);
  }
  EXPECT_EQ(MessageName(ReceiptMsg{bytes}), "RECEIPT(session 7, 3 lines)");
  EXPECT_EQ(MessageName(ReceiptMsg{{1, 2, 3}}), "RECEIPT(3 bytes)");
}

TEST(ReceiptTest, ParseRefusesBadPayloads) {
  const std::vector<uint8_t> good = EncodeReceipt(ThreeLines());
  for (size_t n = 0; n < 48; ++n) {
    EXPECT_EQ(ParseError(std::vector<uint8_t>(good.begin(), good.begin() + n)),
              fmt::format("RECEIPT: payload of {} bytes is shorter than its 48-byte body", n));
  }
  // Every cut inside the lines, and one byte too many.
  for (size_t n = 48; n < good.size(); ++n) {
    EXPECT_FALSE(ParseReceipt(std::span(good.data(), n)).ok()) << n;
  }
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_EQ(ParseError(longer),
            "RECEIPT: tail is 457 bytes, but n_lines 3 x 152-byte lines needs 456");
  std::vector<uint8_t> b = good;
  b[4] = 2;  // n_lines 2 with three lines behind it
  EXPECT_EQ(ParseError(b), "RECEIPT: tail is 456 bytes, but n_lines 2 x 152-byte lines needs 304");
  b = good;
  b[4] = 1;
  b[5] = 1;  // 257
  EXPECT_EQ(ParseError(b), "RECEIPT: n_lines (offset 4) is 257, over the limit of 256 lines");
  b[4] = 0;
  b[5] = 0;
  EXPECT_EQ(ParseError(b), "RECEIPT: n_lines (offset 4) is 0 (the head signs the first line)");
  b = good;
  b[0] = 0;
  EXPECT_EQ(ParseError(b), "RECEIPT: session (offset 0) is 0 (session ids are nonzero)");
  b = good;
  b[47] = 7;
  EXPECT_EQ(ParseError(b), "RECEIPT: reserved byte 2 (offset 47) is 0x07, must be 0");
  b = good;
  b[48 + 2 * 152 + 80 + 5] = 1;
  EXPECT_EQ(ParseError(b), "RECEIPT: line 2 (offset 352): reserved byte 5 is 0x01, must be 0");
  b = good;
  b[48 + 152 + 36] = 2;  // line 1's last = first
  EXPECT_EQ(ParseError(b), "RECEIPT: line 1 (offset 200): window [2, 2) is empty");
  b = good;
  b[40] = 3;
  EXPECT_EQ(ParseError(b), "RECEIPT: version (offset 40) is 3, this stage knows version 2");
  // The largest receipt parses.
  Receipt full;
  full.session = 1;
  const NodeKey k = Key(3);
  for (uint32_t i = 0; i < wire::kMaxReceiptLines; ++i) {
    AppendReceiptLine(&full, k, i, i + 1, 1, RootOf(1));
  }
  auto parsed = ParseReceipt(EncodeReceipt(full));
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->lines.size(), wire::kMaxReceiptLines);
  EXPECT_TRUE(VerifyReceipt(*parsed).ok());
}

// Each signature covers everything before it: no line can be altered, dropped, reordered or
// claimed by another key without a signature failing, and the error names that line.
// A receipt of version 1 (48-byte body with the version field zero, 120-byte lines without a
// commitment), from a stage that predates row commitments, is refused by name.
TEST(ReceiptTest, VersionOneIsRefused) {
  std::vector<uint8_t> v1(48 + 120, 0);
  v1[0] = 7;        // session
  v1[4] = 1;        // n_lines
  v1[48 + 36] = 2;  // last
  EXPECT_EQ(ParseError(v1),
            "RECEIPT: version (offset 40) is 0: a version 1 receipt, without row commitments, is "
            "no longer accepted (version 2 is)");
}

TEST(ReceiptTest, SignaturesCatchEveryChange) {
  const Receipt good = ThreeLines();
  ASSERT_TRUE(VerifyReceipt(good).ok());

  Receipt r = good;
  r.lines[2].tokens = 21;  // a stage claims more work than it signed
  EXPECT_EQ(VerifyError(r), "receipt line 2 (node " + Node(2) + "): the signature does not verify");
  r = good;
  r.lines[0].rows_root[31] ^= 1;  // a stage disowns the rows it committed to
  EXPECT_EQ(VerifyError(r), "receipt line 0 (node " + Node(0) + "): the signature does not verify");
  r = good;
  r.lines[1].last = 5;  // a changed window
  EXPECT_EQ(VerifyError(r), "receipt line 1 (node " + Node(1) + "): the signature does not verify");
  Receipt resigned = good;  // an earlier line changed, the later lines signed again over it
  resigned.lines.resize(1);
  resigned.lines[0].tokens = 40;
  AppendReceiptLine(&resigned, Key(1), 2, 4, 20, RootOf(1));
  AppendReceiptLine(&resigned, Key(2), 4, 5, 20, RootOf(2));
  EXPECT_EQ(VerifyError(resigned),
            "receipt line 0 (node " + Node(0) + "): the signature does not verify");
  r = good;
  std::swap(r.lines[1], r.lines[2]);  // reordered
  EXPECT_EQ(VerifyError(r), "receipt line 1 (node " + Node(2) + "): the signature does not verify");
  r = good;
  r.lines.erase(r.lines.begin() + 1);  // a middle line dropped: the later signature breaks
  EXPECT_EQ(VerifyError(r), "receipt line 1 (node " + Node(2) + "): the signature does not verify");
  r = good;
  r.lines[1].node = Key(5).public_key();  // another key claims the line
  EXPECT_EQ(VerifyError(r), "receipt line 1 (node " + Node(5) + "): the signature does not verify");
  r = good;
  r.session = 8;  // the body is covered too
  EXPECT_EQ(VerifyError(r), "receipt line 0 (node " + Node(0) + "): the signature does not verify");
  r = good;
  r.id[15] ^= 1;
  EXPECT_FALSE(VerifyReceipt(r).ok());
  r = good;
  r.model_id[0] ^= 1;
  EXPECT_FALSE(VerifyReceipt(r).ok());
  r = good;
  r.lines[0].signature[10] ^= 0x40;
  EXPECT_EQ(VerifyError(r), "receipt line 0 (node " + Node(0) + "): the signature does not verify");
  r = good;
  r.lines.clear();
  EXPECT_EQ(VerifyError(r), "receipt 000102030405060708090a0b0c0d0e0f: no lines");

  // A receipt cut after a line still verifies: that it is complete (its windows tile the model,
  // its signers are the ring) is for the head and the market to check.
  r = good;
  r.lines.resize(2);
  EXPECT_TRUE(VerifyReceipt(r).ok());
}

// Fixed seeds give a fixed encoding (Ed25519 signatures are deterministic). tests/market/
// receipt_vector.py recomputes this vector from docs/PROTOCOL.md, "RECEIPT", with Python and the
// openssl command, and compares it with the one here (ctest receipt_vector_test).
TEST(ReceiptTest, KnownAnswerVector) {
  const std::vector<uint8_t> bytes = EncodeReceipt(ThreeLines());
  const std::string expected =
      "0700000003000000000102030405060708090a0b0c0d0e0fa0a1a2a3a4a5a6a7a8a9aaabacadaeaf"
      "020000000000000003a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8"
      "00000000020000001400000000000000808182838485868788898a8b8c8d8e8f9091929394959697"
      "98999a9b9c9d9e9f0000000000000000eeef3b9be8afb29034d6d80e389db10e445a3750c76abab2"
      "c5efd3544584c10ac4201f158eae8374d51cbaadcd7f7a10a15c6b0e5ce15af6350baf7823bd8708"
      "29acbae141bccaf0b22e1a94d34d0bc7361e526d0bfe12c89794bc9322966dd70200000004000000"
      "1400000000000000a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf"
      "0000000000000000893fc0643db9165dc8348e5fd8878cbb4278facd3016ab6e8783bd0ebe1829e9"
      "b42009338e80be5cf5d9e062d465d12607948377544246096ae2dcf4bd8cdc0e2543b92ff1095511"
      "476adc8369db6ddc933665a11978dda1404ee1066ca9559d04000000050000001400000000000000"
      "c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf0000000000000000"
      "c249d678e48437bf2b64dce1c95c1795829580e8cb3cce4e7be33f84c01976c987946b3d05e7d366"
      "a5a8b1c74710f1e4e48687c5d455654d2c7c133f1ce27907";
  EXPECT_EQ(Hex(bytes), expected);
}

TEST(ReceiptTest, RecentMapForgetsTheOldestAndTakesOnce) {
  RecentMap<uint32_t, uint64_t> m(3);
  for (uint32_t k = 1; k <= 4; ++k) m.Put(k, k * 10);
  EXPECT_EQ(m.size(), 3u);
  EXPECT_FALSE(m.contains(1)) << "the oldest is forgotten";
  EXPECT_EQ(m.Take(2), 20u);
  EXPECT_EQ(m.Take(2), std::nullopt) << "taken once";
  m.Put(3, 33);  // replaced, and now the newest
  m.Put(5, 50);
  m.Put(6, 60);
  EXPECT_FALSE(m.contains(4));
  EXPECT_EQ(m.Take(3), 33u);
  EXPECT_EQ(m.Take(5), 50u);
  EXPECT_EQ(m.Take(6), 60u);
  EXPECT_EQ(m.size(), 0u);
}

}  // namespace
}  // namespace kvasir::ring
