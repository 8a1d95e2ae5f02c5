#include "market/lease_table.h"

#include <algorithm>

namespace kvasir::market {

void LeaseTable::Renew(int64_t claim, const std::string& node, double expires, double last_beat) {
  auto [it, inserted] = pending_.try_emplace(claim, PendingLease{node, expires, last_beat});
  if (inserted) return;
  PendingLease& p = it->second;
  if (p.node != node) {
    p = PendingLease{node, expires, last_beat};
    return;
  }
  p.expires = std::max(p.expires, expires);
  p.last_beat = std::max(p.last_beat, last_beat);
}

const PendingLease* LeaseTable::Find(int64_t claim) const {
  auto it = pending_.find(claim);
  return it == pending_.end() ? nullptr : &it->second;
}

void LeaseTable::Written(const std::unordered_map<int64_t, PendingLease>& written) {
  for (const auto& [claim, w] : written) {
    auto it = pending_.find(claim);
    if (it == pending_.end()) continue;
    const PendingLease& p = it->second;
    if (p.node == w.node && p.expires <= w.expires && p.last_beat <= w.last_beat) {
      pending_.erase(it);
    }
  }
}

}  // namespace kvasir::market
