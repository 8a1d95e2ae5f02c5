// Lease renewals held in memory between flushes (docs/MARKET.md, "Renewals in memory"). A
// heartbeat that changes nothing but its claim's lease is answered from here and written to the
// store with the others of the last flush interval in one transaction, instead of one write
// each. Pure bookkeeping: the Store decides when to record and flush. Not thread-safe (the
// Store's thread).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

namespace kvasir::market {

struct PendingLease {
  std::string node;  // the holder the renewal was answered for (64 hex)
  double expires = 0, last_beat = 0;
};

class LeaseTable {
 public:
  // Records a renewal of `claim` by `node`; an earlier one of the same claim by the same node is
  // replaced where the new one is later (a clock that steps back never shortens a lease).
  void Renew(int64_t claim, const std::string& node, double expires, double last_beat);
  // The renewal waiting for `claim`, or null.
  const PendingLease* Find(int64_t claim) const;
  // Forgets `claim` (it was released or evicted: nothing of it is to be written).
  void Forget(int64_t claim) { pending_.erase(claim); }
  const std::unordered_map<int64_t, PendingLease>& pending() const { return pending_; }
  // Forgets the renewals that `written` (a copy of pending() taken before the flush) holds
  // unchanged; those renewed again since stay.
  void Written(const std::unordered_map<int64_t, PendingLease>& written);
  bool empty() const { return pending_.empty(); }
  size_t size() const { return pending_.size(); }

 private:
  std::unordered_map<int64_t, PendingLease> pending_;
};

}  // namespace kvasir::market
