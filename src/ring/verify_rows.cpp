// The rollback rule of verify chunks (verify_rows.h).
#include "ring/verify_rows.h"

namespace kvasir::ring {

Result<int> KeepBeforeChunk(const VerifySpan& last, int length, int pos0) {
  if (pos0 >= length) return length;  // nothing to undo (Forward checks that rows follow)
  if (last.n_rows > 0 && length == last.pos0 + last.n_rows && pos0 > last.pos0 && pos0 < length) {
    return pos0;
  }
  if (last.n_rows > 0) {
    return Error(
        "rows from position {}, but the session holds {} positions and its last verify chunk "
        "took {}..{} (a chunk may start after its first row, up to its end)",
        pos0, length, last.pos0, last.pos0 + last.n_rows - 1);
  }
  return Error("rows from position {}, but the session holds {} positions", pos0, length);
}

VerifySpan ExtendVerifySpan(const VerifySpan& last, int pos0, int n_rows, int max_rows) {
  VerifySpan span{pos0, n_rows};
  if (last.n_rows > 0 && pos0 == last.pos0 + last.n_rows) span = {last.pos0, last.n_rows + n_rows};
  const int cap = max_rows + 1;
  if (span.n_rows > cap) span = {span.pos0 + span.n_rows - cap, cap};
  return span;
}

}  // namespace kvasir::ring
