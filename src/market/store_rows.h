// Shared by the Store's source files (store.cpp, claims.cpp, ledger.cpp): how a claim row is
// selected and read. Not part of the market's interface.
#pragma once

#include <string>

#include "market/sql.h"
#include "market/store.h"

namespace kvasir::market {

// The columns ClaimFromRow reads, from `claims c JOIN models m ON m.id = c.model`.
extern const char* const kClaimColumns;
// A claim from the row of a statement that selected kClaimColumns starting at column `c0`.
ClaimInfo ClaimFromRow(const Stmt& s, int c0);

// The ring's flags (complete, serving, ready, ready_since) and each window's rate from its
// windows and claims as read (store.cpp, Store::ReadModels); `rate_now` is what a claim of an
// uncovered window would lock.
void DeriveRing(RingState* ring, double rate_now);

// The standbys `s` that PromoteStandbys would promote (standby.cpp): proven, of a window without
// its claim, and (when parameter ?1 is 1: set_check_standbys) whose last check passed.
inline constexpr const char* kPromotable =
    "s.standby > 0 AND s.proven = 1 AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.model = "
    "s.model AND c.ring = s.ring AND c.window = s.window AND c.standby = 0) AND (?1 = 0 OR "
    "(s.verified_at > 0 AND s.check_error = ''))";

// Keys of the meta table: the last heartbeat the market answered, and the start of the market
// process.
inline constexpr const char* kMetaLastBeat = "last_beat";
inline constexpr const char* kMetaResumedAt = "resumed_at";
// When the last silence ended (its first heartbeat answered): deadlines to serve start again then.
inline constexpr const char* kMetaSilenceEnd = "silence_end";

// The first 8 hex digits of a key, for messages.
inline std::string Short(const std::string& hex) { return hex.substr(0, 8); }

}  // namespace kvasir::market
