// Row commitments alone (ring/row_commit.h, ring/row_store.h): the Merkle tree against a direct
// recursive definition, every inclusion path of trees of 1..70 leaves, what a path check
// refuses, and the row store's budgets and reveals.
#include "ring/row_commit.h"

#include <gtest/gtest.h>
#include <sodium.h>

#include <cstring>
#include <memory>
#include <vector>

#include "ring/row_store.h"

namespace kvasir::ring {
namespace {

Digest Sha(std::initializer_list<std::span<const uint8_t>> parts) {
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  for (auto p : parts) crypto_hash_sha256_update(&st, p.data(), p.size());
  Digest d;
  crypto_hash_sha256_final(&st, d.data());
  return d;
}

// RFC 9162, 2.1.1, written as the recursion it is.
Digest Mth(std::span<const Digest> d) {
  if (d.size() == 1) return d[0];
  size_t k = 1;
  while (k * 2 < d.size()) k *= 2;
  const uint8_t one = 1;
  const Digest l = Mth(d.first(k)), r = Mth(d.subspan(k));
  return Sha({std::span(&one, 1), l, r});
}

PositionRows Rows(uint32_t pos, size_t n_embd = 4) {
  PositionRows p;
  p.pos = pos;
  p.in.kind = RowKind::kF32;
  p.in.bytes.resize(n_embd * 4);
  for (size_t i = 0; i < p.in.bytes.size(); ++i) p.in.bytes[i] = static_cast<uint8_t>(pos + i);
  p.out.kind = RowKind::kF16;
  p.out.bytes.assign(n_embd * 2, static_cast<uint8_t>(pos * 7));
  return p;
}

std::vector<Digest> Leaves(size_t n) {
  std::vector<Digest> out;
  for (size_t i = 0; i < n; ++i) out.push_back(LeafHash(Rows(static_cast<uint32_t>(i))));
  return out;
}

TEST(RowCommitTest, LeafHashIsTheDocumentedLayout) {
  PositionRows p;
  p.pos = 0x01020304;
  p.in.kind = RowKind::kToken;
  p.in.bytes = {0x2a, 0, 0, 0};
  // No output: kind 0, length 0.
  const std::vector<uint8_t> want = {0x00, 0x04, 0x03, 0x02, 0x01, 0x01, 0x04, 0x00, 0x00, 0x00,
                                     0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(LeafHash(p), Sha({want}));
  PositionRows q = p;
  q.out.kind = RowKind::kToken;
  q.out.bytes = {0, 0, 0, 0};
  EXPECT_NE(LeafHash(p), LeafHash(q)) << "a sampled token 0 differs from no token";
  q = p;
  q.pos = 0x01020305;
  EXPECT_NE(LeafHash(p), LeafHash(q));
}

TEST(RowCommitTest, BuilderMatchesTheRecursiveTreeAndEveryPathVerifies) {
  for (size_t n = 1; n <= 70; ++n) {
    const std::vector<Digest> leaves = Leaves(n);
    MerkleBuilder b;
    for (const Digest& l : leaves) b.Add(l);
    ASSERT_EQ(b.size(), n);
    const Digest root = b.Root();
    ASSERT_EQ(root, Mth(leaves)) << n;
    EXPECT_EQ(MerkleRoot(leaves), root);
    for (uint64_t i = 0; i < n; ++i) {
      const std::vector<Digest> path = MerklePath(leaves, i);
      ASSERT_TRUE(VerifyMerklePath(leaves[i], i, n, path, root)) << n << " " << i;
      // Another leaf, index, size or root, or a changed path, fails.
      if (n > 1) {
        EXPECT_FALSE(VerifyMerklePath(leaves[(i + 1) % n], i, n, path, root));
      }
      EXPECT_FALSE(VerifyMerklePath(leaves[i], i, 2 * n, path, root)) << "another size";
      EXPECT_FALSE(VerifyMerklePath(leaves[i], n, n, path, root));
      Digest other = root;
      other[0] ^= 1;
      EXPECT_FALSE(VerifyMerklePath(leaves[i], i, n, path, other));
      if (!path.empty()) {
        std::vector<Digest> bent = path;
        bent.back()[5] ^= 0x10;
        EXPECT_FALSE(VerifyMerklePath(leaves[i], i, n, bent, root));
        bent = path;
        bent.pop_back();
        EXPECT_FALSE(VerifyMerklePath(leaves[i], i, n, bent, root)) << "a short path";
        if (i + 1 < n) {
          EXPECT_FALSE(VerifyMerklePath(leaves[i], i + 1, n, path, root)) << "another index";
        }
      }
    }
  }
}

TEST(RowCommitTest, ABoundaryRowIsWhatWasSentWidenedBitForBit) {
  // 1.5 and -2.0: f16 0x3e00 0xc000, bf16 0x3fc0 0xc000, f32 0x3fc00000 0xc0000000.
  const RowSide received{RowKind::kF32, {0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0}};
  EXPECT_TRUE(SameBoundaryRow({RowKind::kF16, {0x00, 0x3e, 0x00, 0xc0}}, received));
  EXPECT_TRUE(SameBoundaryRow({RowKind::kBF16, {0xc0, 0x3f, 0x00, 0xc0}}, received));
  EXPECT_TRUE(SameBoundaryRow(received, received));
  EXPECT_FALSE(SameBoundaryRow({RowKind::kF16, {0x01, 0x3e, 0x00, 0xc0}}, received));
  EXPECT_FALSE(SameBoundaryRow({RowKind::kF16, {0x00, 0x3e}}, received)) << "a shorter row";
  EXPECT_FALSE(SameBoundaryRow({RowKind::kToken, {0, 0, 0, 0}}, {RowKind::kToken, {0, 0, 0, 0}}));
  EXPECT_FALSE(SameBoundaryRow(received, {RowKind::kF32, {0x00, 0x00, 0xc0}}));
}

TEST(RowCommitTest, DigestHexRoundTripsAndRefusesBadText) {
  const Digest d = LeafHash(Rows(3));
  auto back = ParseDigestHex(DigestHex(d));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, d);
  EXPECT_FALSE(ParseDigestHex("abc").ok());
  EXPECT_FALSE(ParseDigestHex(std::string(64, 'G')).ok());
  EXPECT_FALSE(ParseDigestHex(std::string(64, 'A')).ok()) << "lowercase only";
}

SessionRows Session(const std::shared_ptr<RowStore>& store, uint32_t n, size_t n_embd = 4) {
  SessionRows s(store);
  for (uint32_t i = 0; i < n; ++i) s.Add(Rows(i, n_embd));
  return s;
}

ReceiptId Id(uint8_t b) {
  ReceiptId id;
  id.fill(b);
  return id;
}

TEST(RowStoreTest, RevealsSignedSessionsAndTheRevealChecks) {
  auto store = std::make_shared<RowStore>(RowStoreOptions{});
  SessionRows s = Session(store, 11);
  const Digest root = s.Root();
  EXPECT_EQ(root, Mth(Leaves(11)));
  EXPECT_EQ(store->open_bytes(), s.bytes());
  store->Put(5, std::move(s));
  EXPECT_EQ(store->open_bytes(), 0u);
  EXPECT_GT(store->bytes(), 11u * (32 + 16 + 8));
  const std::vector<uint64_t> want = {0, 7, 10};
  auto unsigned_yet = store->Reveal(Id(1), want);
  ASSERT_FALSE(unsigned_yet.ok());
  EXPECT_EQ(unsigned_yet.status().code(), StatusCode::kNotFound);
  store->Bind(5, root, Id(1));
  auto r = store->Reveal(Id(1), want);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->positions.size(), 3u);
  EXPECT_EQ(r->positions[1].rows, Rows(7));
  EXPECT_TRUE(CheckReveal(*r, root, 11).ok());

  // A reveal of rows other than those committed to, or against another commitment, fails.
  RowReveal lie = *r;
  lie.positions[1].rows.out.bytes[0] ^= 1;
  EXPECT_EQ(CheckReveal(lie, root, 11).message(),
            "position 7: the revealed rows do not match the signed commitment " + DigestHex(root));
  lie = *r;
  lie.positions[2].index = 9;
  EXPECT_FALSE(CheckReveal(lie, root, 11).ok());
  lie = *r;
  lie.positions[1] = lie.positions[0];
  EXPECT_EQ(CheckReveal(lie, root, 11).message(), "position 0: revealed twice");
  EXPECT_EQ(CheckReveal(*r, root, 12).message(),
            "the reveal is of a session of 11 positions, the receipt signed 12");
  Digest other = root;
  other[9] ^= 4;
  EXPECT_FALSE(CheckReveal(*r, other, 11).ok());

  const std::vector<uint64_t> past = {11};
  EXPECT_EQ(store->Reveal(Id(1), past).status().message(),
            "position 11 of a session of 11 positions");
  EXPECT_EQ(store->Reveal(Id(2), want).status().code(), StatusCode::kNotFound);
  const std::vector<uint64_t> many(kMaxRevealPositions + 1, 0);
  EXPECT_FALSE(store->Reveal(Id(1), many).ok());
  // A bind with another root finds nothing.
  store->Put(6, Session(store, 3));
  store->Bind(6, root, Id(3));
  EXPECT_EQ(store->Reveal(Id(3), want).status().code(), StatusCode::kNotFound);
}

TEST(RowStoreTest, ForgetsTheOldestBeyondItsBytesAndItsAge) {
  double now = 100;
  const size_t one = Session(std::make_shared<RowStore>(RowStoreOptions{}), 8).bytes();
  ASSERT_GT(one, 0u);
  auto store = std::make_shared<RowStore>(RowStoreOptions{3 * one, 60}, [&] { return now; });
  for (uint32_t i = 1; i <= 5; ++i) {
    SessionRows s = Session(store, 8);
    const Digest root = s.Root();
    store->Put(i, std::move(s));
    store->Bind(i, root, Id(static_cast<uint8_t>(i)));
    now += 1;
  }
  EXPECT_EQ(store->sessions(), 3u);
  EXPECT_LE(store->bytes(), 3 * one);
  const std::vector<uint64_t> first = {0};
  EXPECT_FALSE(store->Reveal(Id(2), first).ok()) << "the oldest went first";
  EXPECT_TRUE(store->Reveal(Id(3), first).ok());
  EXPECT_TRUE(store->Reveal(Id(5), first).ok());
  now += 57.5;  // session 3 closed at 102: 60.5 s ago; session 4 59.5 s ago
  EXPECT_FALSE(store->Reveal(Id(3), first).ok());
  EXPECT_TRUE(store->Reveal(Id(5), first).ok());
  EXPECT_EQ(store->sessions(), 2u);
  now += 10;
  EXPECT_EQ(store->Reveal(Id(5), first).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->sessions(), 0u);
  EXPECT_EQ(store->bytes(), 0u);
}

// Open sessions reserve their rows as they run: the closed ones make room, oldest first, and a
// session that finds none drops its rows (and can then reveal nothing) but keeps its commitment.
TEST(RowStoreTest, OpenSessionsStayWithinTheBudget) {
  const size_t one = Session(std::make_shared<RowStore>(RowStoreOptions{}), 8).bytes();
  auto store = std::make_shared<RowStore>(RowStoreOptions{3 * one, 600});
  SessionRows closed = Session(store, 8);
  const Digest closed_root = closed.Root();
  store->Put(1, std::move(closed));
  store->Bind(1, closed_root, Id(1));
  SessionRows a = Session(store, 8), b = Session(store, 8);
  EXPECT_TRUE(a.kept() && b.kept());
  EXPECT_EQ(store->open_bytes(), 2 * one);
  EXPECT_EQ(store->sessions(), 1u);
  SessionRows c = Session(store, 8);  // needs the closed session's room
  EXPECT_TRUE(c.kept());
  EXPECT_EQ(store->sessions(), 0u);
  SessionRows d = Session(store, 8);  // no room left at all
  EXPECT_FALSE(d.kept());
  EXPECT_EQ(d.bytes(), 0u);
  EXPECT_EQ(d.Root(), Mth(Leaves(8))) << "the commitment does not depend on keeping";
  EXPECT_EQ(store->open_bytes(), 3 * one);
  store->Put(4, std::move(d));  // nothing to keep
  EXPECT_EQ(store->sessions(), 0u);
  {
    SessionRows gone = std::move(a);  // a session that fails: its reservation is given back
  }
  EXPECT_EQ(store->open_bytes(), 2 * one);
  store->Put(2, std::move(b));
  EXPECT_EQ(store->open_bytes(), one);
  EXPECT_EQ(store->bytes(), one);

  // A budget of 0 keeps nothing.
  auto none = std::make_shared<RowStore>(RowStoreOptions{0, 60});
  EXPECT_FALSE(none->keeps_rows());
  SessionRows tree_only = Session(none, 4);
  EXPECT_FALSE(tree_only.kept());
  EXPECT_EQ(tree_only.Root(), Mth(Leaves(4)));
  none->Put(1, std::move(tree_only));
  EXPECT_EQ(none->sessions(), 0u);
}

}  // namespace
}  // namespace kvasir::ring
