// Nonces of heartbeats answered but not yet written (docs/MARKET.md, "Nonces in memory"). With
// SQLite and renewals held in memory, a heartbeat's nonce is checked against this table and the
// store's, and recorded here instead of in its own write; the Store writes the table with the
// renewals of the next flush. Pure bookkeeping; not thread-safe (the Store's thread).
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

namespace kvasir::market {

struct PendingNonce {
  std::string node;   // 64 hex
  std::string nonce;  // 32 hex
  double expires = 0;
};

class NonceTable {
 public:
  // Whether `node` used `nonce` in a request recorded here and not yet written.
  bool Contains(const std::string& node, const std::string& nonce) const;
  // Records a nonce; false (and nothing recorded) when `node` used it before.
  bool Add(const std::string& node, const std::string& nonce, double expires);
  // In the order they were recorded.
  const std::vector<PendingNonce>& pending() const { return pending_; }
  // Forgets the first `n` of pending() (they were written).
  void Written(size_t n);
  bool empty() const { return pending_.empty(); }
  size_t size() const { return pending_.size(); }

 private:
  static std::string Key(const std::string& node, const std::string& nonce) {
    return node + ':' + nonce;
  }
  std::vector<PendingNonce> pending_;
  std::unordered_set<std::string> keys_;  // Key() of each of pending_
};

}  // namespace kvasir::market
