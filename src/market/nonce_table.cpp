#include "market/nonce_table.h"

#include <algorithm>

namespace kvasir::market {

bool NonceTable::Contains(const std::string& node, const std::string& nonce) const {
  return keys_.count(Key(node, nonce)) != 0;
}

bool NonceTable::Add(const std::string& node, const std::string& nonce, double expires) {
  if (!keys_.insert(Key(node, nonce)).second) return false;
  pending_.push_back(PendingNonce{node, nonce, expires});
  return true;
}

void NonceTable::Written(size_t n) {
  n = std::min(n, pending_.size());
  for (size_t i = 0; i < n; ++i) keys_.erase(Key(pending_[i].node, pending_[i].nonce));
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
}

}  // namespace kvasir::market
