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

RowSide TokenSide(int32_t id) {
  RowSide side{RowKind::kToken, std::vector<uint8_t>(sizeof(id))};
  std::memcpy(side.bytes.data(), &id, sizeof(id));
  return side;
}

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

void StageImpl::CommitRows(const Work& w, const HiddenMsg* out, std::optional<int32_t> sampled) {
  auto it = sessions_.find(w.session);
  if (it == sessions_.end() || w.n_tokens <= 0) return;
  SessionRows& commit = it->second.commit;
  const size_t n_embd = static_cast<size_t>(window_->config().n_embd);
  const size_t out_row = out != nullptr ? out->data.size() / static_cast<size_t>(w.n_tokens) : 0;
  for (int i = 0; i < w.n_tokens; ++i) {
    PositionRows p;
    p.pos = static_cast<uint32_t>(w.pos0 + i);
    if (is_head()) {
      p.in = TokenSide(w.tokens[static_cast<size_t>(i)]);
    } else {
      // [n_tokens, n_embd] f32: the values this window computed on.
      p.in.kind = RowKind::kF32;
      p.in.bytes.resize(n_embd * sizeof(float));
      std::memcpy(p.in.bytes.data(), w.hidden.data() + static_cast<size_t>(i) * n_embd,
                  p.in.bytes.size());
    }
    if (out != nullptr) {
      // The bytes sent on, in the boundary dtype.
      p.out.kind = KindOf(out->dtype);
      const auto* row = out->data.data() + static_cast<size_t>(i) * out_row;
      p.out.bytes.assign(row, row + out_row);
    } else if (sampled.has_value() && i == w.n_tokens - 1) {
      p.out = TokenSide(*sampled);
    }
    commit.Add(std::move(p));
  }
}

void StageImpl::KeepClosedRows(Session& s) { receipts_.Closed(s.id, s.rows, std::move(s.commit)); }

}  // namespace kvasir::ring
