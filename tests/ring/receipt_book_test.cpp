// The receipt book alone (ring/receipt_book.h): a receipt started by a head's book, signed by the
// books of the other stages and checked back by the head's, without links or a model; and what
// each refuses, and what a peer can make a book keep.
#include "ring/receipt_book.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ring/receipt.h"

namespace kvasir::ring {
namespace {

std::shared_ptr<const NodeKey> Key(int i) {
  std::array<uint8_t, 32> seed;
  for (size_t j = 0; j < seed.size(); ++j) seed[j] = static_cast<uint8_t>(i * 32 + j + 1);
  return std::make_shared<const NodeKey>(NodeKey::FromSeed(seed));
}

ModelId Model(uint8_t b) {
  ModelId id;
  id.fill(b);
  return id;
}

// A session's rows: `n` positions whose input is the token pos + salt.
SessionRows Rows(const std::shared_ptr<RowStore>& store, uint32_t n, int32_t salt) {
  SessionRows s(store);
  for (uint32_t pos = 0; pos < n; ++pos) {
    PositionRows p;
    p.pos = pos;
    p.in.kind = RowKind::kToken;
    const int32_t token = static_cast<int32_t>(pos) + salt;
    p.in.bytes.resize(sizeof(token));
    std::memcpy(p.in.bytes.data(), &token, sizeof(token));
    s.Add(std::move(p));
  }
  return s;
}

// A ring of three stages of a 6-layer model: [0,2) the head, [2,5), [5,6); each with its own key
// and a row store that keeps rows.
struct Ring {
  std::vector<std::shared_ptr<RowStore>> stores;
  std::vector<std::unique_ptr<ReceiptBook>> books;
  explicit Ring(ModelId model = Model(0xA5)) {
    const uint32_t bounds[] = {0, 2, 5, 6};
    for (int i = 0; i < 3; ++i) {
      stores.push_back(std::make_shared<RowStore>(RowStoreOptions{}));
      books.push_back(std::make_unique<ReceiptBook>(ReceiptBookOptions{
          "s" + std::to_string(i), Key(i), model, bounds[i], bounds[i + 1], 6, stores.back()}));
    }
  }
  ReceiptBook& head() { return *books[0]; }
  // Session `session` closed everywhere with 5 rows; returns the receipt the head starts.
  std::vector<uint8_t> CloseEverywhere(uint32_t session) {
    for (int i = 1; i < 3; ++i) books[i]->Closed(session, 5, Rows(stores[i], 5, 100 * i));
    return head().Start(session, 5, Rows(stores[0], 5, 0));
  }
};

template <typename T>
std::string Refusal(const Result<T>& r) {
  return r.ok() ? "(accepted)" : r.status().message();
}

TEST(ReceiptBookTest, AReceiptGoesAroundAndEveryLineCommitsToItsRows) {
  Ring ring;
  const auto started = ring.CloseEverywhere(7);
  EXPECT_EQ(ring.head().in_flight(), 1u);
  auto second = ring.books[1]->Sign(started);
  ASSERT_TRUE(second.ok()) << second.status().message();
  auto third = ring.books[2]->Sign(*second);
  ASSERT_TRUE(third.ok()) << third.status().message();
  auto back = ring.head().CameBack(*third);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(EncodeReceipt(*back), *third);
  EXPECT_EQ(ring.head().in_flight(), 0u);
  EXPECT_EQ(ring.books[1]->closed(), 0u);

  auto r = ParseReceipt(*third);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->session, 7u);
  ASSERT_EQ(r->lines.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const ReceiptLine& line = r->lines[static_cast<size_t>(i)];
    EXPECT_EQ(line.node, Key(i)->public_key());
    EXPECT_EQ(line.tokens, 5u);
    EXPECT_EQ(line.rows_root, Rows(nullptr, 5, 100 * i).Root()) << "line " << i;
    // Each stage's rows are found by the receipt id and check against its line.
    const uint64_t indices[] = {0, 4};
    auto reveal = ring.stores[static_cast<size_t>(i)]->Reveal(r->id, indices);
    ASSERT_TRUE(reveal.ok()) << reveal.status().message();
    EXPECT_TRUE(CheckReveal(*reveal, line.rows_root, line.tokens).ok());
  }
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ReceiptBookTest, TheHeadTakesEachReceiptBackOnceAndOnlyComplete) {
  Ring ring;
  const auto started = ring.CloseEverywhere(7);
  auto second = ring.books[1]->Sign(started);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(Has(Refusal(ring.head().CameBack(*second)),
                  "its lines end at layer 5, not at the model's 6"));
  auto third = ring.books[2]->Sign(*second);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(ring.head().CameBack(*third).ok());
  EXPECT_TRUE(Has(Refusal(ring.head().CameBack(*third)), "came back before"));
}

TEST(ReceiptBookTest, TheHeadRefusesReceiptsItDidNotStart) {
  Ring ring;
  ring.CloseEverywhere(7);
  // Another head's receipt for the same session, complete and valid.
  Ring other;
  const auto theirs = other.CloseEverywhere(7);
  auto signed2 = other.books[2]->Sign(*other.books[1]->Sign(theirs));
  ASSERT_TRUE(signed2.ok());
  EXPECT_TRUE(Has(Refusal(ring.head().CameBack(*signed2)), "this head did not send it around"));
  EXPECT_TRUE(Has(Refusal(ring.head().CameBack(std::vector<uint8_t>(10, 0))), "RECEIPT dropped"));
  EXPECT_EQ(ring.head().in_flight(), 1u);
}

TEST(ReceiptBookTest, TheHeadRefusesItsIdWithAnotherFirstLineOrSession) {
  Ring ring;
  auto r = ParseReceipt(ring.CloseEverywhere(7));
  ASSERT_TRUE(r.ok());
  // The same id, its first line signed by another node.
  Receipt forged = *r;
  forged.lines.clear();
  AppendReceiptLine(&forged, *Key(9), 0, 2, 5, Digest{});
  AppendReceiptLine(&forged, *Key(1), 2, 6, 5, Digest{});
  EXPECT_TRUE(Has(Refusal(ring.head().CameBack(EncodeReceipt(forged))), "not this head's"));
  // The same id, for another session.
  Receipt moved = *r;
  moved.session = 8;
  moved.lines.clear();
  AppendReceiptLine(&moved, *Key(0), 0, 2, 5, Digest{});
  AppendReceiptLine(&moved, *Key(1), 2, 6, 5, Digest{});
  EXPECT_TRUE(Has(Refusal(ring.head().CameBack(EncodeReceipt(moved))), "another session"));
}

TEST(ReceiptBookTest, AStageSignsOnlySessionsThatClosedThereAndEachOnce) {
  Ring ring;
  const auto started = ring.head().Start(7, 5, Rows(ring.stores[0], 5, 0));
  EXPECT_TRUE(Has(Refusal(ring.books[1]->Sign(started)), "did not close here"));
  ring.books[1]->Closed(7, 5, Rows(ring.stores[1], 5, 100));
  EXPECT_TRUE(ring.books[1]->Sign(started).ok());
  EXPECT_TRUE(Has(Refusal(ring.books[1]->Sign(started)), "did not close here"));
}

TEST(ReceiptBookTest, AStageRefusesWhatItCannotSignAndKeepsTheSessionForTheRealOne) {
  Ring ring;
  const auto started = ring.CloseEverywhere(7);
  // Not where this window starts: the head's receipt offered to the third stage.
  EXPECT_TRUE(Has(Refusal(ring.books[2]->Sign(started)),
                  "its last line ends at layer 2, this stage starts at 5"));
  // Another model.
  Ring other(Model(0x11));
  const auto foreign = other.CloseEverywhere(7);
  EXPECT_TRUE(Has(Refusal(ring.books[1]->Sign(foreign)), "this stage runs model"));
  // A line whose signature does not verify.
  auto r = ParseReceipt(started);
  ASSERT_TRUE(r.ok());
  r->lines[0].tokens += 1;
  EXPECT_TRUE(Has(Refusal(ring.books[1]->Sign(EncodeReceipt(*r))), "does not verify"));
  EXPECT_TRUE(Has(Refusal(ring.books[1]->Sign(std::vector<uint8_t>{1, 2, 3})), "RECEIPT dropped"));
  // None of these used up the session: the real receipt is still signed.
  EXPECT_TRUE(ring.books[1]->Sign(started).ok());
}

TEST(ReceiptBookTest, WhatPeersMakeItKeepIsBounded) {
  Ring ring;
  for (uint32_t s = 1; s <= ReceiptBook::kMaxRecent + 5; ++s) {
    ring.books[1]->Closed(s, 1, Rows(nullptr, 1, 0));
    ring.head().Start(s, 1, Rows(nullptr, 1, 0));
  }
  EXPECT_EQ(ring.books[1]->closed(), ReceiptBook::kMaxRecent);
  EXPECT_EQ(ring.head().in_flight(), ReceiptBook::kMaxRecent);
}

}  // namespace
}  // namespace kvasir::ring

namespace kvasir::ring {
namespace {

wire::ClientCount WireCount(const ClientCount& c) {
  wire::ClientCount w{};
  std::memcpy(w.client_key, c.client.data(), sizeof(w.client_key));
  w.tokens = c.tokens;
  std::memcpy(w.signature, c.signature.data(), sizeof(w.signature));
  return w;
}

// A head whose client said it will vouch (docs/PROTOCOL.md, "Client counts"): the receipt waits
// for the count on that client's CLOSE and carries it when it verifies; a count forged or signed
// for another session, from another client, or that never comes, leaves the receipt without one.
TEST(ReceiptBookTest, AReceiptWaitsForItsClientsCountAndGoesWithoutABadOrLateOne) {
  Ring ring;
  const auto client = Key(9);
  std::array<uint8_t, 16> id;
  id.fill(0x42);
  const ModelId model = Model(0xA5);
  // Nothing is sent until the client's count comes.
  EXPECT_FALSE(ring.head().AwaitClient(3, /*client=*/1, id, 5, Rows(ring.stores[0], 5, 0), 100));
  EXPECT_FALSE(ring.head().ClientVouched(3, /*client=*/2,
                                         WireCount(SignClientCount(*client, id, model, 3, 5))))
      << "another client's link";
  auto sent = ring.head().ClientVouched(3, 1, WireCount(SignClientCount(*client, id, model, 3, 5)));
  ASSERT_TRUE(sent.has_value());
  auto r = ParseReceipt(*sent);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->id, id);
  ASSERT_TRUE(r->client.has_value());
  EXPECT_EQ(r->client->tokens, 5u);
  EXPECT_EQ(r->client->client, client->public_key());
  EXPECT_TRUE(VerifyReceipt(*r).ok()) << VerifyReceipt(*r).message();
  EXPECT_FALSE(
      ring.head().ClientVouched(3, 1, WireCount(SignClientCount(*client, id, model, 3, 5))))
      << "once";

  // Signed for another session: the receipt goes, without the count.
  id.fill(0x43);
  EXPECT_FALSE(ring.head().AwaitClient(4, 1, id, 5, Rows(ring.stores[0], 5, 0), 100));
  sent = ring.head().ClientVouched(4, 1, WireCount(SignClientCount(*client, id, model, 5, 5)));
  ASSERT_TRUE(sent.has_value());
  r = ParseReceipt(*sent);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->client.has_value());

  // No count by the deadline: sent without one, the oldest first; later ones wait on.
  id.fill(0x44);
  EXPECT_FALSE(ring.head().AwaitClient(5, 1, id, 5, Rows(ring.stores[0], 5, 0), 100));
  id.fill(0x45);
  EXPECT_FALSE(ring.head().AwaitClient(6, 1, id, 5, Rows(ring.stores[0], 5, 0), 200));
  EXPECT_TRUE(ring.head().Overdue(99).empty());
  const auto late = ring.head().Overdue(150);
  ASSERT_EQ(late.size(), 1u);
  r = ParseReceipt(late[0]);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->session, 5u);
  EXPECT_FALSE(r->client.has_value());
  EXPECT_EQ(ring.head().Overdue(250).size(), 1u);
}

}  // namespace
}  // namespace kvasir::ring
