// A client's signed count of the tokens it received, carried in a receipt (ring/receipt.h,
// "ClientCount"): its encoding behind the body's flag, what the parser refuses, and what the
// signatures catch (a forged, altered, replayed or stripped count).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ring/receipt.h"

namespace kvasir::ring {
namespace {

NodeKey Key(int i) {
  std::array<uint8_t, 32> seed;
  for (size_t j = 0; j < seed.size(); ++j) seed[j] = static_cast<uint8_t>(i * 32 + j + 1);
  return NodeKey::FromSeed(seed);
}

// Session `session` (id bytes `id_byte`) of 20 rows on two stages, whose client (Key(9)) counted
// `client_tokens`; the lines are signed after the count is in.
Receipt WithClient(uint64_t client_tokens, uint32_t session = 7, uint8_t id_byte = 3) {
  Receipt r;
  r.id.fill(id_byte);
  r.model_id.fill(0xA5);
  r.session = session;
  r.client = SignClientCount(Key(9), r.id, r.model_id, r.session, client_tokens);
  AppendReceiptLine(&r, Key(0), 0, 2, 20, Digest{});
  AppendReceiptLine(&r, Key(1), 2, 5, 20, Digest{});
  return r;
}

// `r`'s lines signed again over what `r` now holds.
Receipt Resigned(Receipt r) {
  const std::vector<ReceiptLine> lines = r.lines;
  r.lines.clear();
  for (size_t i = 0; i < lines.size(); ++i) {
    AppendReceiptLine(&r, Key(static_cast<int>(i)), lines[i].first, lines[i].last, lines[i].tokens,
                      lines[i].rows_root);
  }
  return r;
}

std::string ParseError(const std::vector<uint8_t>& payload) {
  auto r = ParseReceipt(payload);
  return r.ok() ? "(parsed)" : r.status().message();
}

TEST(ClientCountReceiptTest, RoundTripsBehindTheFlag) {
  const Receipt r = WithClient(12);
  const std::vector<uint8_t> bytes = EncodeReceipt(r);
  ASSERT_EQ(bytes.size(), 48u + 104u + 2 * 152u);
  EXPECT_EQ(bytes[44], wire::kReceiptHasClientCount);
  const PublicKey client = Key(9).public_key();
  EXPECT_EQ(std::memcmp(bytes.data() + 48, client.data(), 32), 0);
  uint64_t tokens = 0;
  std::memcpy(&tokens, bytes.data() + 48 + 32, sizeof(tokens));
  EXPECT_EQ(tokens, 12u);

  auto parsed = ParseReceipt(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ASSERT_TRUE(parsed->client.has_value());
  EXPECT_EQ(parsed->client->client, client);
  EXPECT_EQ(parsed->client->tokens, 12u);
  EXPECT_EQ(parsed->client->signature, r.client->signature);
  ASSERT_EQ(parsed->lines.size(), 2u);
  EXPECT_EQ(parsed->lines[1].last, 5u);
  EXPECT_EQ(EncodeReceipt(*parsed), bytes);
  EXPECT_TRUE(VerifyReceipt(*parsed).ok()) << VerifyReceipt(*parsed).message();
  EXPECT_EQ(CreditableTokens(*parsed), 12u);

  // Without a count the flag is clear and the ring's count is the one to credit.
  Receipt plain = r;
  plain.client.reset();
  plain = Resigned(plain);
  const std::vector<uint8_t> plain_bytes = EncodeReceipt(plain);
  EXPECT_EQ(plain_bytes.size(), 48u + 2 * 152u);
  EXPECT_EQ(plain_bytes[44], 0);
  EXPECT_TRUE(VerifyReceipt(plain).ok());
  EXPECT_EQ(CreditableTokens(plain), 20u);
  // A client count above the ring's is capped by the ring's.
  EXPECT_EQ(CreditableTokens(WithClient(50)), 20u);
}

TEST(ClientCountReceiptTest, TheParserRefusesUnknownFlagsAndWrongSizes) {
  const std::vector<uint8_t> good = EncodeReceipt(WithClient(12));
  std::vector<uint8_t> b = good;
  b[44] = 3;
  EXPECT_EQ(ParseError(b), "RECEIPT: flags (offset 44) are 0x03, only 0x01 is known");
  b = good;
  b.pop_back();
  EXPECT_EQ(ParseError(b),
            "RECEIPT: tail is 407 bytes, but a client count and n_lines 2 x 152-byte lines needs "
            "408");
  // The flag cleared: the count's bytes are read as lines and do not fit.
  b = good;
  b[44] = 0;
  EXPECT_EQ(ParseError(b), "RECEIPT: tail is 408 bytes, but n_lines 2 x 152-byte lines needs 304");
  // The flag set on a receipt without a count.
  Receipt plain = WithClient(12);
  plain.client.reset();
  b = EncodeReceipt(Resigned(plain));
  b[44] = 1;
  EXPECT_EQ(ParseError(b),
            "RECEIPT: tail is 304 bytes, but a client count and n_lines 2 x 152-byte lines needs "
            "408");
  b[44] = 0;
  b[45] = 1;
  EXPECT_EQ(ParseError(b), "RECEIPT: reserved byte 0 (offset 45) is 0x01, must be 0");
}

TEST(ClientCountReceiptTest, ForgedAlteredReplayedAndStrippedCountsDoNotVerify) {
  // Forged: another key signed a count that names the client.
  Receipt r = WithClient(12);
  r.client = SignClientCount(Key(5), r.id, r.model_id, r.session, 12);
  r.client->client = Key(9).public_key();
  r = Resigned(r);
  Status s = VerifyReceipt(r);
  EXPECT_EQ(s.code(), StatusCode::kUnauthenticated);
  EXPECT_NE(s.message().find("the client count (12 tokens, client "), std::string::npos)
      << s.message();
  EXPECT_FALSE(VerifyClientCount(r).ok());

  // Inflated by the ring after the client signed, lines signed again: the count does not verify.
  r = WithClient(12);
  r.client->tokens = 20;
  EXPECT_FALSE(VerifyClientCount(Resigned(r)).ok());
  // Changed in transit after the lines were signed: line 0 no longer verifies.
  EXPECT_EQ(VerifyReceipt(r).message().rfind("receipt line 0 (node ", 0), 0u)
      << VerifyReceipt(r).message();

  // Replayed: session 7's good count in session 8 (and in another receipt id of session 7).
  const Receipt seven = WithClient(12);
  Receipt other = WithClient(12, 8);
  other.client = seven.client;
  EXPECT_FALSE(VerifyReceipt(Resigned(other)).ok());
  other = WithClient(12, 7, 4);
  other.client = seven.client;
  EXPECT_FALSE(VerifyReceipt(Resigned(other)).ok());
  other = WithClient(12);
  other.model_id[0] ^= 1;
  other.client = seven.client;
  EXPECT_FALSE(VerifyReceipt(Resigned(other)).ok());

  // Stripped after the lines were signed: the flag is in the body the lines signed.
  Receipt stripped = WithClient(12);
  stripped.client.reset();
  EXPECT_FALSE(VerifyReceipt(stripped).ok());
  EXPECT_TRUE(VerifyReceipt(seven).ok());
}

}  // namespace
}  // namespace kvasir::ring
