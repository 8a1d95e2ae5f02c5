// Audits of credited work (docs/MARKET.md, "Audits"): after a receipt is credited, the market
// picks a fraction of sessions at random and asks each holder that signed one to reveal the rows
// of a few random positions; a reveal that does not match the commitment its receipt line
// signed, or a refusal, forfeits the line's credit and bans the node for a time that grows with
// each offence. The requests ride on heartbeat replies and the reveals on the next (signed)
// heartbeat. This file: the policy and the JSON both sides speak, pure.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "ring/row_store.h"

namespace kvasir::market {

// kvasir market's default --audit-rate.
inline constexpr double kDefaultAuditRate = 0.05;

struct AuditPolicy {
  double rate = 0;    // the fraction of credited receipts audited (--audit-rate)
  int positions = 4;  // positions asked of each holder (fewer when the session is shorter)
  // The session's first positions asked too (at most kMaxAuditPrefix), so that an auditor can
  // recompute them: a window's output at position p depends on its inputs at every position
  // before (audit/recompute.h).
  int prefix = 0;
  double reveal_s = 600;  // a holder that has not answered this long after it was asked refused
  double ban_s = 600;     // the first offence's ban; each further one doubles it (at most a day)
  // 0: the draws (which sessions, which positions) are unpredictable (libsodium). Otherwise a
  // repeatable sequence from this seed: for tests only, a market never sets it.
  uint64_t seed = 0;
};

// At most this many requests ride on one heartbeat reply, and answers on one heartbeat: one, so
// that the rows of a wide model's reveal fit the 1 MiB of a heartbeat body (the holder beats
// again at once after a reveal, and its reply brings the next request).
inline constexpr size_t kMaxAuditsPerBeat = 1;
// A revealed row is at most this many bytes (a 64 Ki-wide f32 row): the heartbeat body's 1 MiB
// bounds the whole anyway.
inline constexpr size_t kMaxRevealRowBytes = size_t{1} << 18;

// kvasir market's default --audit-prefix, and the most it may be: with the random positions,
// at most ring::kMaxRevealPositions are asked.
inline constexpr int kDefaultAuditPrefix = 12;
inline constexpr int kMaxAuditPrefix = 56;

struct AuditRequest {
  int64_t id = 0;
  std::string receipt;              // 32 hex digits
  std::vector<uint64_t> positions;  // indices of the session's rows, distinct
};

// A holder's answer: the reveal, or why it refuses.
struct AuditAnswer {
  int64_t id = 0;
  std::string refusal;  // non-empty: refused
  ring::RowReveal reveal;
};

// `"audits": [...]` of a heartbeat reply, and its reading by the holder.
nlohmann::json AuditRequestsToJson(const std::vector<AuditRequest>& requests);
Result<std::vector<AuditRequest>> ParseAuditRequests(const nlohmann::json& beat);

// One element of `"reveals": [...]` of a heartbeat body: the reveal of audit `id`, or its refusal
// with the reason (the store's error).
nlohmann::json AuditAnswerToJson(int64_t id, const Result<ring::RowReveal>& reveal);
// The `"reveals"` of a heartbeat body (absent: none). Every field checked and bounded: at most
// kMaxAuditsPerBeat answers, ring::kMaxRevealPositions positions each, rows of at most
// kMaxRevealRowBytes, paths of at most 64 digests. Errors name the field.
Result<std::vector<AuditAnswer>> ParseAuditAnswers(const nlohmann::json& body);

}  // namespace kvasir::market
