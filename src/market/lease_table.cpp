#include "market/lease_table.h"

#include <algorithm>
#include <utility>

namespace kvasir::market {

bool BeatStamp::Contains(std::string_view nonce) const {
  for (size_t at = 0; at + kNonceDigits <= nonces.size(); at += kNonceDigits) {
    if (std::string_view(nonces).substr(at, kNonceDigits) == nonce) return true;
  }
  return false;
}

bool BeatStamp::Refuses(int64_t t, std::string_view nonce) const {
  if (t != time) return t < time;
  return count() >= kMaxNonces || Contains(nonce);
}

void BeatStamp::Add(int64_t t, std::string_view nonce) {
  if (t < time || nonce.size() != kNonceDigits) return;
  if (t > time) {
    time = t;
    nonces.clear();
  }
  if (!Contains(nonce)) nonces.append(nonce);
}

void BeatStamp::Merge(const BeatStamp& other) {
  if (other.time < time) return;
  if (other.time > time) {
    *this = other;
    return;
  }
  for (size_t at = 0; at + kNonceDigits <= other.nonces.size(); at += kNonceDigits) {
    const std::string_view n = std::string_view(other.nonces).substr(at, kNonceDigits);
    if (!Contains(n)) nonces.append(n);
  }
}

void MergeLease(PendingLease* into, const PendingLease& p) {
  if (into->node != p.node) {
    *into = p;
    return;
  }
  into->expires = std::max(into->expires, p.expires);
  into->last_beat = std::max(into->last_beat, p.last_beat);
  into->stamp.Merge(p.stamp);
}

void LeaseTable::Renew(int64_t claim, const std::string& node, double expires, double last_beat,
                       const BeatStamp& stamp) {
  const PendingLease p{node, expires, last_beat, stamp};
  auto [it, inserted] = pending_.try_emplace(claim, p);
  if (!inserted) MergeLease(&it->second, p);
}

const PendingLease* LeaseTable::Find(int64_t claim) const {
  auto it = pending_.find(claim);
  return it == pending_.end() ? nullptr : &it->second;
}

void LeaseTable::Written(const PendingLeases& written) {
  for (const auto& [claim, w] : written) {
    auto it = pending_.find(claim);
    if (it == pending_.end()) continue;
    const PendingLease& p = it->second;
    if (p.node == w.node && p.expires <= w.expires && p.last_beat <= w.last_beat &&
        p.stamp == w.stamp) {
      pending_.erase(it);
    }
  }
}

void LeaseTable::Restore(const PendingLeases& unwritten) {
  for (const auto& [claim, u] : unwritten) {
    auto [it, inserted] = pending_.try_emplace(claim, u);
    if (inserted) continue;
    // Recorded since, by the same node: both. By another node (the id's holder changed): newer.
    if (it->second.node == u.node) MergeLease(&it->second, u);
  }
}

}  // namespace kvasir::market
