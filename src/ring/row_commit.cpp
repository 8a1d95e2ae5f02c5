#include "ring/row_commit.h"

#include <bit>
#include <cstring>

#include "base/check.h"
#include "base/sha256.h"
#include "kernels/kernels.h"

namespace kvasir::ring {
namespace {

// OpenSSL's SHA-256 (SHA extensions where the CPU has them: several times libsodium's portable
// code, bench/row_commit_bench.cpp), one hasher per thread, reset by each Finish.
class Hasher {
 public:
  Hasher() : sha_(ThreadSha()) {}
  void Put(const void* p, size_t n) { sha_.Update({static_cast<const uint8_t*>(p), n}); }
  void PutU8(uint8_t v) { Put(&v, 1); }
  void PutU32(uint32_t v) {
    const uint8_t b[4] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8),
                          static_cast<uint8_t>(v >> 16), static_cast<uint8_t>(v >> 24)};
    Put(b, 4);
  }
  Digest Finish() { return sha_.Finish(); }

 private:
  static Sha256& ThreadSha() {
    thread_local Sha256 sha;
    return sha;
  }
  Sha256& sha_;
};

Digest Node(const Digest& left, const Digest& right) {
  Hasher h;
  h.PutU8(1);
  h.Put(left.data(), left.size());
  h.Put(right.data(), right.size());
  return h.Finish();
}

void PutSide(Hasher* h, const RowSide& side) {
  h->PutU8(static_cast<uint8_t>(side.kind));
  h->PutU32(static_cast<uint32_t>(side.bytes.size()));
  if (!side.bytes.empty()) h->Put(side.bytes.data(), side.bytes.size());
}

// The largest power of two below n (n >= 2).
uint64_t Split(uint64_t n) { return std::bit_floor(n - 1); }

}  // namespace

Digest LeafHash(const PositionRows& rows) {
  KV_CHECK(rows.in.bytes.size() <= UINT32_MAX && rows.out.bytes.size() <= UINT32_MAX,
           "a row of {} / {} bytes", rows.in.bytes.size(), rows.out.bytes.size());
  Hasher h;
  h.PutU8(0);
  h.PutU32(rows.pos);
  PutSide(&h, rows.in);
  PutSide(&h, rows.out);
  return h.Finish();
}

void MerkleBuilder::Add(const Digest& leaf) {
  stack_.push_back({leaf, 1});
  ++size_;
  // Two perfect subtrees of one size merge: the stack mirrors the binary digits of size_.
  while (stack_.size() >= 2 && stack_[stack_.size() - 2].leaves == stack_.back().leaves) {
    Subtree right = stack_.back();
    stack_.pop_back();
    stack_.back().hash = Node(stack_.back().hash, right.hash);
    stack_.back().leaves += right.leaves;
  }
}

Digest MerkleBuilder::Root() const {
  KV_CHECK(!stack_.empty(), "the root of an empty tree");
  // RFC 9162 splits at the largest power of two, so the tree is the perfect subtrees folded from
  // the right.
  Digest r = stack_.back().hash;
  for (size_t i = stack_.size() - 1; i-- > 0;) r = Node(stack_[i].hash, r);
  return r;
}

Digest MerkleRoot(std::span<const Digest> leaves) {
  MerkleBuilder b;
  for (const Digest& l : leaves) b.Add(l);
  return b.Root();
}

std::vector<Digest> MerklePath(std::span<const Digest> leaves, uint64_t index) {
  KV_CHECK(index < leaves.size(), "leaf {} of {}", index, leaves.size());
  std::vector<Digest> path;
  // Top down, then reversed: each level keeps the half that holds the leaf.
  while (leaves.size() > 1) {
    const uint64_t k = Split(leaves.size());
    if (index < k) {
      path.push_back(MerkleRoot(leaves.subspan(k)));
      leaves = leaves.first(k);
    } else {
      path.push_back(MerkleRoot(leaves.first(k)));
      leaves = leaves.subspan(k);
      index -= k;
    }
  }
  return {path.rbegin(), path.rend()};
}

bool VerifyMerklePath(const Digest& leaf, uint64_t index, uint64_t n, std::span<const Digest> path,
                      const Digest& root) {
  if (index >= n) return false;
  uint64_t fn = index, sn = n - 1;
  Digest r = leaf;
  for (const Digest& p : path) {
    if (sn == 0) return false;
    if ((fn & 1) != 0 || fn == sn) {
      r = Node(p, r);
      while ((fn & 1) == 0 && fn != 0) {
        fn >>= 1;
        sn >>= 1;
      }
    } else {
      r = Node(r, p);
    }
    fn >>= 1;
    sn >>= 1;
  }
  return sn == 0 && r == root;
}

bool SameBoundaryRow(const RowSide& sent, const RowSide& received) {
  if (received.kind != RowKind::kF32 || received.bytes.size() % 4 != 0) return false;
  const size_t n = received.bytes.size() / 4;
  if (sent.kind == RowKind::kF32) return sent.bytes == received.bytes;
  if ((sent.kind != RowKind::kF16 && sent.kind != RowKind::kBF16) || sent.bytes.size() != 2 * n) {
    return false;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, sent.bytes.data() + 2 * i, 2);
    const float wide = sent.kind == RowKind::kF16 ? F16ToF32(h) : BF16ToF32(h);
    if (std::memcmp(&wide, received.bytes.data() + 4 * i, 4) != 0) return false;
  }
  return true;
}

std::string DigestHex(const Digest& d) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(64);
  for (uint8_t b : d) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

Result<Digest> ParseDigestHex(std::string_view hex) {
  if (hex.size() != 64) return Error("a digest is 64 hex digits, not {} characters", hex.size());
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  Digest d;
  for (size_t i = 0; i < d.size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return Error("a digest must be lowercase hex: '{}'", hex.substr(0, 64));
    d[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return d;
}

}  // namespace kvasir::ring
