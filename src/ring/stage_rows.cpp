// Stage runtime, part 6: row commitments (docs/PROTOCOL.md, "Row commitments"). As a session's
// rows run, each position's input and output are hashed into the session's Merkle tree (and kept
// when the row store keeps rows); when the session closes, the receipt book keeps its root for
// the receipt line that signs it and gives its rows to the row store. Runs on the compute thread
// only.
#include <bit>
#include <cstring>

#include "ring/stage_impl.h"

namespace kvasir::ring {
namespace {

static_assert(std::endian::native == std::endian::little, "rows are hashed as they lie in memory");

RowKind KindOf(wire::Dtype dtype) {
  switch (dtype) {
    case wire::Dtype::kF32:
      return RowKind::kF32;
    case wire::Dtype::kF16:
      return RowKind::kF16;
    case wire::Dtype::kBF16:
      return RowKind::kBF16;
  }
  return RowKind::kNone;  // unreachable: messages with other dtypes do not decode
}

}  // namespace

RowSide TokenRowSide(int32_t id) {
  RowSide side{RowKind::kToken, std::vector<uint8_t>(sizeof(id))};
  std::memcpy(side.bytes.data(), &id, sizeof(id));
  return side;
}

RowSide F32RowSide(std::span<const float> row) {
  RowSide side{RowKind::kF32, std::vector<uint8_t>(row.size_bytes())};
  std::memcpy(side.bytes.data(), row.data(), row.size_bytes());
  return side;
}

void StageImpl::CommitRows(const Work& w, const HiddenMsg* out, std::optional<int32_t> sampled) {
  auto it = sessions_.find(w.session);
  if (it == sessions_.end() || w.n_tokens <= 0) return;
  SessionRows& commit = it->second.commit;
  const size_t out_row = out != nullptr ? out->data.size() / static_cast<size_t>(w.n_tokens) : 0;
  for (int i = 0; i < w.n_tokens; ++i) {
    PositionRows p;
    p.pos = static_cast<uint32_t>(w.pos0 + i);
    p.in = entry_->InputRow(w, i);  // the token id on the head, else the f32 row
    if (out != nullptr) {
      // The bytes sent on, in the boundary dtype.
      p.out.kind = KindOf(out->dtype);
      const auto* row = out->data.data() + static_cast<size_t>(i) * out_row;
      p.out.bytes.assign(row, row + out_row);
    } else if (sampled.has_value() && i == w.n_tokens - 1) {
      p.out = TokenRowSide(*sampled);
    }
    commit.Add(std::move(p));
  }
}

void StageImpl::KeepClosedRows(Session& s) { receipts_.Closed(s.id, s.rows, std::move(s.commit)); }

}  // namespace kvasir::ring
