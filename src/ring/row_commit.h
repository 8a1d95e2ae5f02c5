// Commitments to the boundary rows of a session (docs/PROTOCOL.md, "Row commitments"). Every
// stage hashes, for each position its window runs, what it took in (a token id on the head, a
// hidden row elsewhere) and what it gave out (a hidden row, or on the last stage the token it
// sampled, if any) into a leaf, and the leaves of a session, in the order the rows ran, into a
// Merkle tree whose root its receipt line signs. A few positions can later be revealed with their
// paths and checked against that one root. Pure: no links, no model; any thread.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace kvasir::ring {

using Digest = std::array<uint8_t, 32>;  // SHA-256

// What one side of a position carries. Values are frozen (they are hashed into leaves).
enum class RowKind : uint8_t {
  kNone = 0,   // nothing (the last stage's output at a position it did not sample)
  kToken = 1,  // a token id: 4 bytes, i32 little-endian
  kF32 = 2,    // a hidden row: n_embd × 4 bytes, f32 little-endian
  kF16 = 3,    // n_embd × 2 bytes (wire::Dtype::kF16)
  kBF16 = 4,   // n_embd × 2 bytes (wire::Dtype::kBF16)
};
inline constexpr uint8_t kMaxRowKind = 4;

struct RowSide {
  RowKind kind = RowKind::kNone;
  std::vector<uint8_t> bytes;  // as above; empty for kNone
  bool operator==(const RowSide&) const = default;
};

// One position a window ran: its input and its output.
struct PositionRows {
  uint32_t pos = 0;
  RowSide in, out;
  bool operator==(const PositionRows&) const = default;
};

// SHA-256(0x00 || pos u32 || in.kind u8 || in.bytes length u32 || in.bytes || out.kind u8 ||
// out.bytes length u32 || out.bytes), integers little-endian.
Digest LeafHash(const PositionRows& rows);

// The Merkle tree of RFC 9162 (section 2.1) over leaf hashes: an inner node is SHA-256(0x01 ||
// left || right), a tree of n > 1 leaves splits after the largest power of two below n.
// Built incrementally: O(log n) digests held, whatever the number of leaves.
class MerkleBuilder {
 public:
  void Add(const Digest& leaf);
  uint64_t size() const { return size_; }
  // The root of the leaves added so far. Requires size() > 0.
  Digest Root() const;

 private:
  struct Subtree {
    Digest hash;
    uint64_t leaves;
  };
  std::vector<Subtree> stack_;  // perfect subtrees, largest (leftmost) first
  uint64_t size_ = 0;
};

// The root of `leaves` (not empty), as MerkleBuilder gives.
Digest MerkleRoot(std::span<const Digest> leaves);

// The inclusion path of leaf `index` (< leaves.size()), bottom up (RFC 9162, 2.1.3.1).
std::vector<Digest> MerklePath(std::span<const Digest> leaves, uint64_t index);

// Whether `leaf` is leaf `index` of a tree of `n` leaves with root `root`, by `path`
// (RFC 9162, 2.1.3.2). Any values are safe.
bool VerifyMerklePath(const Digest& leaf, uint64_t index, uint64_t n, std::span<const Digest> path,
                      const Digest& root);

// Whether `received` (a stage's input row, kind kF32) is `sent` (its predecessor's output row, as
// sent: kF32, kF16 or kBF16) widened to f32, bit for bit: what one stage gave out and the next
// took in at a position agree. False for any other kinds or sizes.
bool SameBoundaryRow(const RowSide& sent, const RowSide& received);

std::string DigestHex(const Digest& d);
Result<Digest> ParseDigestHex(std::string_view hex);

}  // namespace kvasir::ring
