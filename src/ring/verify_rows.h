// Rollback after a verify chunk (docs/PROTOCOL.md, "Speculation"). A stage runs a verify chunk's
// K + 1 rows (a token and its drafts) with a checkpoint before each; the next chunk of that
// session starts right after the last accepted row, so its position says what to undo: every
// stage keeps the positions before it and drops the rejected rows, whatever stage it is, without
// another message. Pure, so the rule is tested alone (tests/ring/verify_rows_test.cpp).
#pragma once

#include "base/status.h"

namespace kvasir::ring {

// Rows every stage's window can roll back (WindowOptions::max_checkpoints): the verify chunks of a
// session in flight at once hold at most this many rows past their first.
inline constexpr int kStageRollbackRows = 16;

// The verify chunks a session ran last on a stage, one after another with nothing between them
// (with overlap, several of a session's chunks are in flight): positions [pos0, pos0 + n_rows);
// n_rows 0 when its last chunk was not one.
struct VerifySpan {
  int pos0 = 0;
  int n_rows = 0;
};

// The length a session of `length` positions keeps before running a chunk that starts at
// `pos0`, `last` being its last verify chunk: `length` when pos0 is not before it (nothing to
// undo; whether the rows follow on is Forward's check, as chunks may wait in a queue); pos0 when
// `last` ended at `length` and pos0 lies after its first row (its first row, the token fed, is
// always kept). Anything else is refused, naming the positions: a peer may not make a stage undo
// rows that were not drafts.
Result<int> KeepBeforeChunk(const VerifySpan& last, int length, int pos0);

// The span after a verify chunk of `n_rows` rows from `pos0` ran, `last` being the span before:
// the chunk extends `last` when it starts where `last` ends, else starts a span of its own. A
// span keeps at most `max_rows` + 1 rows (its oldest dropped), so that any length it lets a
// chunk keep lies within the `max_rows` rows a window can roll back
// (WindowOptions::max_checkpoints).
VerifySpan ExtendVerifySpan(const VerifySpan& last, int pos0, int n_rows, int max_rows);

}  // namespace kvasir::ring
