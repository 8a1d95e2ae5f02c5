#include "ring/row_store.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>

namespace kvasir::ring {

SessionRows::SessionRows(std::shared_ptr<RowStore> store) : store_(std::move(store)) {
  if (store_ != nullptr && !store_->keeps_rows()) store_.reset();
}

SessionRows::~SessionRows() { Drop(); }

SessionRows::SessionRows(SessionRows&& other) noexcept
    : store_(std::move(other.store_)),
      tree_(std::move(other.tree_)),
      leaves_(std::move(other.leaves_)),
      rows_(std::move(other.rows_)),
      bytes_(std::exchange(other.bytes_, 0)) {
  other.tree_ = MerkleBuilder();
}

SessionRows& SessionRows::operator=(SessionRows&& other) noexcept {
  if (this != &other) {
    Drop();
    store_ = std::move(other.store_);
    tree_ = std::exchange(other.tree_, MerkleBuilder());
    leaves_ = std::move(other.leaves_);
    rows_ = std::move(other.rows_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void SessionRows::Drop() {
  if (store_ != nullptr && bytes_ > 0) store_->Release(bytes_);
  store_.reset();
  bytes_ = 0;
  leaves_ = {};
  rows_ = {};
}

void SessionRows::Add(PositionRows rows) {
  const Digest leaf = LeafHash(rows);
  tree_.Add(leaf);
  if (store_ == nullptr) return;
  const size_t more =
      sizeof(Digest) + sizeof(PositionRows) + rows.in.bytes.size() + rows.out.bytes.size();
  if (!store_->Reserve(more)) {
    Drop();  // a session with a gap cannot be revealed: keep none of it
    return;
  }
  bytes_ += more;
  leaves_.push_back(leaf);
  rows_.push_back(std::move(rows));
}

Digest SessionRows::Root() const { return tree_.size() == 0 ? Digest{} : tree_.Root(); }

RowStore::RowStore(RowStoreOptions options, std::function<double()> now)
    : options_(options), now_(std::move(now)) {
  if (!now_) {
    now_ = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
}

bool RowStore::Reserve(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  TrimLocked(now_());
  while (!entries_.empty() && bytes_ + open_bytes_ + bytes > options_.max_bytes) {
    bytes_ -= entries_.front().rows.bytes_;
    entries_.pop_front();
  }
  if (open_bytes_ + bytes > options_.max_bytes) return false;
  open_bytes_ += bytes;
  return true;
}

void RowStore::Release(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  open_bytes_ -= std::min(bytes, open_bytes_);
}

void RowStore::Put(uint32_t session, SessionRows rows) {
  if (rows.store_.get() != this || rows.size() == 0) return;  // its destructor releases
  std::lock_guard<std::mutex> lock(mu_);
  const double now = now_();
  Entry e;
  e.session = session;
  e.root = rows.Root();
  e.closed_at = now;
  // Its reservation becomes the store's; the entry holds no reference back to the store.
  open_bytes_ -= std::min(rows.bytes_, open_bytes_);
  bytes_ += rows.bytes_;
  rows.store_.reset();
  e.rows = std::move(rows);
  entries_.push_back(std::move(e));
  TrimLocked(now);
}

void RowStore::TrimLocked(double now) {
  while (!entries_.empty() &&
         (bytes_ > options_.max_bytes || now - entries_.front().closed_at > options_.max_age_s)) {
    bytes_ -= entries_.front().rows.bytes_;
    entries_.pop_front();
  }
}

void RowStore::Bind(uint32_t session, const Digest& root, const ReceiptId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  TrimLocked(now_());
  // The newest first: a session id the head reuses names the latest session.
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->session == session && it->root == root && !it->bound) {
      it->bound = true;
      it->id = id;
      return;
    }
  }
}

Result<RowReveal> RowStore::Reveal(const ReceiptId& id, std::span<const uint64_t> indices) {
  if (indices.size() > kMaxRevealPositions) {
    return Error("a reveal of {} positions (at most {} at once)", indices.size(),
                 kMaxRevealPositions);
  }
  std::lock_guard<std::mutex> lock(mu_);
  TrimLocked(now_());
  for (const Entry& e : entries_) {
    if (!e.bound || e.id != id) continue;
    const SessionRows& s = e.rows;
    RowReveal out;
    out.n = s.size();
    out.root = e.root;
    for (uint64_t i : indices) {
      if (i >= s.size()) {
        return Error("position {} of a session of {} positions", i, s.size());
      }
      RevealedPosition& p = out.positions.emplace_back();
      p.index = i;
      p.rows = s.rows_[i];
      p.path = MerklePath(s.leaves_, i);
    }
    return out;
  }
  return Error(StatusCode::kNotFound, "no rows kept for that receipt");
}

size_t RowStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

size_t RowStore::open_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_bytes_;
}

size_t RowStore::sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

Status CheckReveal(const RowReveal& reveal, const Digest& root, uint64_t n) {
  if (reveal.n != n) {
    return Error("the reveal is of a session of {} positions, the receipt signed {}", reveal.n, n);
  }
  std::set<uint64_t> seen;
  for (const RevealedPosition& p : reveal.positions) {
    if (p.index >= n) return Error("position {}: past the session's {} positions", p.index, n);
    if (!seen.insert(p.index).second) return Error("position {}: revealed twice", p.index);
    if (static_cast<uint8_t>(p.rows.in.kind) > kMaxRowKind ||
        static_cast<uint8_t>(p.rows.out.kind) > kMaxRowKind) {
      return Error("position {}: an unknown row kind", p.index);
    }
    if (!VerifyMerklePath(LeafHash(p.rows), p.index, n, p.path, root)) {
      return Error("position {}: the revealed rows do not match the signed commitment {}", p.index,
                   DigestHex(root));
    }
  }
  return Status::Ok();
}

}  // namespace kvasir::ring
