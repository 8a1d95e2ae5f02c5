// Who may hold a connection on a server, and for how long: the pure part of net/server.h. Every
// decision is a function of the table's state and the clock the caller passes (milliseconds of a
// steady clock), so tests drive it without sockets or time.
//
// The rules (docs/ARCHITECTURE.md, "One server skeleton"):
// - Two pools with their own limits: `kOpen` for every new connection, `kProven` for connections
//   that proved something (a verified signature, a verified token, an expected relay edge). A
//   flood of strangers fills only the open pool, so it can neither evict nor refuse a proven one.
// - A connection from an address at its per-address cap is refused. When a pool is full, a newcomer
//   takes the place of the oldest evictable connection of the address that holds the most, as long
//   as that address holds at least two more than the newcomer's: a handful of addresses cannot
//   keep a full table from anyone else, and equal holders do not churn each other's connections.
// - Each stage has a deadline from the moment it began; from `pressure_from` connections in a
//   pool on, its stages get their shorter deadlines, so silent connections leave within a second or
//   two when places are scarce. A connection being answered (`kHandling`) is never evicted.
// - Addresses are grouped before counting: an IPv6 /64 is one address (AdmissionKey).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace kvasir::net {

using ConnId = uint64_t;
using Millis = int64_t;  // a steady clock in milliseconds; only differences matter

// What a connection is doing. Listed from the most to the least worth evicting.
enum class Stage : uint8_t {
  kClosing,   // answered; its close is under way
  kIdle,      // between requests on a kept-alive connection
  kSilent,    // accepted; nothing that counts as a request has arrived yet (TLS, first bytes)
  kReading,   // a request has begun but is not complete
  kWriting,   // an answer is being sent
  kWaiting,   // waiting for something the server needs (the relay: an edge's other end)
  kHandling,  // the server is working on its request: never evicted, no deadline
};
inline constexpr int kStageCount = 7;
const char* StageName(Stage stage);

enum class Pool : uint8_t { kOpen, kProven };
inline constexpr int kPoolCount = 2;
const char* PoolName(Pool pool);

struct StageTimeout {
  int normal_ms = 0;   // 0: no deadline
  int pressed_ms = 0;  // under pressure; 0: as normal
};

struct PoolLimits {
  int max_total = 512;
  int max_per_address = 64;
  int pressure_from = 256;  // connections in the pool from which the pressed deadlines apply
};

struct AdmissionPolicy {
  PoolLimits open, proven;
  std::array<StageTimeout, kStageCount> timeouts{};  // by Stage
  StageTimeout& timeout(Stage s) { return timeouts[static_cast<int>(s)]; }
  const StageTimeout& timeout(Stage s) const { return timeouts[static_cast<int>(s)]; }
};

// Refuses limits below 1, a pressure point above the pool's size, negative deadlines; the message
// names the field.
Status ValidatePolicy(const AdmissionPolicy& policy);

// The unit addresses are counted in: the IP itself for IPv4 (and IPv4-mapped IPv6), the /64 prefix
// for IPv6 ("2001:db8:1:2::/64"), since one host is handed a whole /64. Text that is not an IP is
// returned as it is.
std::string AdmissionKey(std::string_view ip);

struct Admission {
  bool admitted = false;
  // A connection the decision took the place of: already out of the table; the caller closes it.
  std::optional<ConnId> evicted;
  std::string evicted_address;
  std::string why;  // for a refusal: which limit, naming the address
};

class AdmissionTable {
 public:
  explicit AdmissionTable(AdmissionPolicy policy) : policy_(std::move(policy)) {}

  // A new connection `id` from `address` (an AdmissionKey) at `now`: admitted to the open pool in
  // stage kSilent, possibly in the place of another connection, or refused.
  Admission Admit(ConnId id, const std::string& address, Millis now);
  // Moves `id` to the proven pool by the same rules (its stage and clock stay). Not admitted: it
  // stays where it is (the proven pool is full of addresses holding no more than its own).
  Admission Promote(ConnId id);
  // Enters `stage`; its deadline counts from `now`, or from the start of the current stage when
  // `restart_clock` is false (a request that began in kSilent keeps its time in kReading).
  void SetStage(ConnId id, Stage stage, Millis now, bool restart_clock = true);
  // Forgets `id` (closed, or no longer limited, like a paired relay edge). Unknown ids are ignored.
  void Remove(ConnId id);
  // Removes and returns the connections whose stage deadline has passed at `now`; the caller
  // closes them.
  struct Expired {
    ConnId id;
    Stage stage;
    Pool pool;
  };
  std::vector<Expired> TakeExpired(Millis now);

  bool Contains(ConnId id) const { return entries_.count(id) != 0; }
  std::optional<Pool> PoolOf(ConnId id) const;
  std::optional<Stage> StageOf(ConnId id) const;
  int Count(Pool pool) const { return pools_[static_cast<int>(pool)].total; }
  int CountFrom(Pool pool, const std::string& address) const;
  bool Pressed(Pool pool) const;
  // When `id`'s current stage ends at the latest, given the pressure now; nullopt: no deadline.
  std::optional<Millis> DeadlineOf(ConnId id) const;
  const AdmissionPolicy& policy() const { return policy_; }

 private:
  struct Entry {
    std::string address;
    Pool pool = Pool::kOpen;
    Stage stage = Stage::kSilent;
    Millis since = 0;
  };
  struct PoolState {
    int total = 0;
    std::map<std::string, int> per_address;
  };
  const PoolLimits& Limits(Pool pool) const {
    return pool == Pool::kOpen ? policy_.open : policy_.proven;
  }
  // Whether `address` may have one more connection in `pool`; fills `out` (evicted, why).
  bool MakeRoom(Pool pool, const std::string& address, Admission* out);
  void Count(Pool pool, const std::string& address, int delta);

  AdmissionPolicy policy_;
  std::unordered_map<ConnId, Entry> entries_;
  std::array<PoolState, kPoolCount> pools_;
};

}  // namespace kvasir::net
