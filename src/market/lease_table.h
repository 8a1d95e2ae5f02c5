// Lease renewals held in memory between flushes (docs/MARKET.md, "Renewals in memory"). A
// heartbeat that changes nothing but its claim's lease is answered from here and written to the
// store with the others of the last flush interval in one transaction, instead of one write
// each. With it goes the claim's replay stamp (BeatStamp: the signed time and nonces of its
// latest heartbeats), which a heartbeat of any kind updates. Pure bookkeeping: the Store decides
// when to record and flush. Not thread-safe (the Store's thread).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace kvasir::market {

// What refuses a replayed heartbeat of one claim without a row per heartbeat (docs/MARKET.md,
// "Replayed heartbeats"): the latest signed time (Unix seconds) accepted, and the nonces accepted
// at that second. A heartbeat signed earlier is refused; one of the same second is refused when
// its nonce is among them, or when kMaxNonces of them were accepted already.
struct BeatStamp {
  static constexpr size_t kNonceDigits = 32;
  static constexpr size_t kMaxNonces = 1024;
  int64_t time = 0;    // 0: none accepted
  std::string nonces;  // kNonceDigits hex digits each, concatenated
  // Whether a heartbeat signed at `t` with `nonce` would be refused.
  bool Refuses(int64_t t, std::string_view nonce) const;
  // Records an accepted heartbeat (one this stamp does not refuse).
  void Add(int64_t t, std::string_view nonce);
  // Both: the later second's, or the nonces of both at the same second.
  void Merge(const BeatStamp& other);
  bool Contains(std::string_view nonce) const;
  size_t count() const { return nonces.size() / kNonceDigits; }
  bool operator==(const BeatStamp&) const = default;
};

struct PendingLease {
  std::string node;  // the holder the renewal was answered for (64 hex)
  // 0, 0: only the stamp changed (a heartbeat whose other changes were written at once).
  double expires = 0, last_beat = 0;
  BeatStamp stamp;  // time 0 when the store keeps nonces instead (PostgreSQL)
};

using PendingLeases = std::unordered_map<int64_t, PendingLease>;

class LeaseTable {
 public:
  // Records a renewal of `claim` by `node`; an earlier one of the same claim by the same node is
  // replaced where the new one is later (a clock that steps back never shortens a lease), and
  // the stamps are merged.
  void Renew(int64_t claim, const std::string& node, double expires, double last_beat,
             const BeatStamp& stamp = {});
  // The renewal waiting for `claim`, or null.
  const PendingLease* Find(int64_t claim) const;
  // Forgets `claim` (it was released or evicted: nothing of it is to be written).
  void Forget(int64_t claim) { pending_.erase(claim); }
  const PendingLeases& pending() const { return pending_; }
  // Forgets the renewals that `written` (a copy of pending() taken before the flush) holds
  // unchanged; those renewed again since stay.
  void Written(const PendingLeases& written);
  // Hands every renewal over (to a flush written on another thread) and forgets them.
  PendingLeases Take() { return std::exchange(pending_, {}); }
  // Takes back renewals a flush failed to write, merged with those recorded since (Renew).
  void Restore(const PendingLeases& unwritten);
  bool empty() const { return pending_.empty(); }
  size_t size() const { return pending_.size(); }

 private:
  PendingLeases pending_;
};

// `into` merged with `p` (Renew's rule); `into->node` empty takes `p` as it is.
void MergeLease(PendingLease* into, const PendingLease& p);

}  // namespace kvasir::market
