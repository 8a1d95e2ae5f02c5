#include "ring/replay_rows.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

namespace kvasir::ring {

void ReplayRows::Add(const HiddenMsg& h) {
  if (max_bytes_ == 0 || h.n_tokens == 0) return;
  auto it = kept_.find(h.session);
  if (it == kept_.end()) {
    if (h.pos0 != 0) return;  // its first rows are not here: nothing of it can be replayed
    it = kept_.emplace(h.session, Kept{}).first;
    it->second.dtype = h.dtype;
    it->second.n_embd = h.n_embd;
    it->second.row_bytes = static_cast<size_t>(h.n_embd) * wire::DtypeSize(h.dtype);
  }
  Kept& k = it->second;
  if (h.pos0 > k.n || h.dtype != k.dtype || h.n_embd != k.n_embd ||
      h.data.size() != static_cast<size_t>(h.n_tokens) * k.row_bytes) {
    Drop(h.session);  // a gap, or rows of another shape: what is kept is no longer whole
    if (h.pos0 == 0) Add(h);
    return;
  }
  const size_t old_capacity = k.data.capacity();
  k.data.resize(static_cast<size_t>(h.pos0) * k.row_bytes);
  k.data.insert(k.data.end(), h.data.begin(), h.data.end());
  k.n = h.pos0 + h.n_tokens;
  k.last_add = ++tick_;
  Account(k, old_capacity);
  if (bytes_ > max_bytes_) Evict(h.session);
}

uint32_t ReplayRows::kept(uint32_t session) const {
  auto it = kept_.find(session);
  return it == kept_.end() ? 0 : it->second.n;
}

void ReplayRows::Truncate(uint32_t session, uint32_t n) {
  auto it = kept_.find(session);
  if (it == kept_.end() || n >= it->second.n) return;
  if (n == 0) {
    Drop(session);
    return;
  }
  Kept& k = it->second;
  const size_t old_capacity = k.data.capacity();
  k.data.resize(static_cast<size_t>(n) * k.row_bytes);
  k.n = n;
  Account(k, old_capacity);
}

HiddenMsg ReplayRows::Rows(uint32_t session, uint32_t pos0, uint32_t n, uint16_t flags) const {
  auto it = kept_.find(session);
  KV_CHECK(it != kept_.end() && n > 0 && uint64_t{pos0} + n <= it->second.n,
           "ReplayRows::Rows: session {} rows {}+{} are not kept", session, pos0, n);
  const Kept& k = it->second;
  HiddenMsg h;
  h.session = session;
  h.pos0 = pos0;
  h.n_tokens = n;
  h.n_embd = k.n_embd;
  h.dtype = k.dtype;
  h.flags = flags;
  const auto first = k.data.begin() + static_cast<std::ptrdiff_t>(pos0 * k.row_bytes);
  h.data.assign(first, first + static_cast<std::ptrdiff_t>(n * k.row_bytes));
  return h;
}

void ReplayRows::Drop(uint32_t session) {
  auto it = kept_.find(session);
  if (it == kept_.end()) return;
  bytes_ -= it->second.data.capacity();
  kept_.erase(it);
}

void ReplayRows::Retain(const std::function<bool(uint32_t)>& live) {
  for (auto it = kept_.begin(); it != kept_.end();) {
    if (live(it->first)) {
      ++it;
    } else {
      bytes_ -= it->second.data.capacity();
      it = kept_.erase(it);
    }
  }
}

void ReplayRows::Account(Kept& k, size_t old_capacity) {
  // A buffer that shrank a lot gives its memory back (a long session rolled back, or cut).
  if (k.data.capacity() > 2 * k.data.size() + (size_t{1} << 20)) k.data.shrink_to_fit();
  bytes_ = bytes_ - old_capacity + k.data.capacity();
}

void ReplayRows::Evict(uint32_t keep_last) {
  if (auto own = kept_.find(keep_last);
      own != kept_.end() && own->second.data.capacity() > max_bytes_) {
    // It alone does not fit: the others stay.
    bytes_ -= own->second.data.capacity();
    kept_.erase(own);
    ++evicted_;
  }
  while (bytes_ > max_bytes_ && !kept_.empty()) {
    auto victim = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->first == keep_last && kept_.size() > 1) continue;
      if (victim == kept_.end() || it->second.data.capacity() > victim->second.data.capacity() ||
          (it->second.data.capacity() == victim->second.data.capacity() &&
           it->second.last_add < victim->second.last_add)) {
        victim = it;
      }
    }
    bytes_ -= victim->second.data.capacity();
    kept_.erase(victim);
    ++evicted_;
  }
}

}  // namespace kvasir::ring
