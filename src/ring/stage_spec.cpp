// Stage runtime: speculation's part in every stage (docs/PROTOCOL.md, "Speculation"). A verify
// chunk runs like any other with a checkpoint before each row; the next chunk of its session
// tells by its position which rows were accepted, and the rest are dropped here before it runs.
// Runs on the compute thread only.
#include <fmt/format.h>

#include "base/log.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {

Status StageImpl::RollBackBefore(Session& s, int pos0) {
  const int seq = static_cast<int>(s.id);
  const int length = window_->SequenceLength(seq);
  if (length < 0) return Status::Ok();  // not open: Forward names it
  KV_ASSIGN_OR_RETURN(int keep, KeepBeforeChunk(s.verify, length, pos0));
  if (keep == length) return Status::Ok();
  KV_RETURN_IF_ERROR(window_->TruncateSequence(seq, keep));
  s.verify = VerifySpan{};
  return Status::Ok();
}

bool StageImpl::RollBackBeforeRows(std::span<const Work> batch, std::vector<Work>* kept) {
  bool all = true;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Work& w = batch[i];
    auto it = sessions_.find(w.session);
    Status st = it == sessions_.end() ? Status::Ok() : RollBackBefore(it->second, w.pos0);
    if (st.ok()) {
      if (!all) kept->push_back(w);
      continue;
    }
    if (all) kept->assign(batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(i));
    all = false;
    const std::string why =
        fmt::format("{}: {}", w.tokens.empty() ? "HIDDEN" : "TOKEN", st.message());
    KV_LOG_WARN("{}: session {} refused: {}", options_.name, w.session, why);
    FailSession(w.session, wire::ErrorCode::kBadRequest, why);
  }
  return all;
}

bool StageImpl::LookAheadDue() const {
  if (!spec_) return false;
  for (const auto& [id, s] : sessions_) {
    if (s.draft && !s.closing && spec_->LookAheadDue(*s.draft)) return true;
  }
  return false;
}

bool StageImpl::LookAhead() {
  if (!spec_) return false;
  for (auto& [id, s] : sessions_) {
    if (s.draft && !s.closing && spec_->LookAheadDue(*s.draft)) {
      spec_->LookAhead(*s.tail, *s.draft);
      return true;
    }
  }
  return false;
}

void StageImpl::NoteRan(const Work& w) {
  auto it = sessions_.find(w.session);
  if (it == sessions_.end()) return;
  it->second.verify =
      w.verify ? ExtendVerifySpan(it->second.verify, w.pos0, w.n_tokens, window_->max_checkpoints())
               : VerifySpan{};
}

void StageImpl::DropUnverifiedRows(Session& s) {
  const int seq = static_cast<int>(s.id);
  if (s.verify.n_rows == 0 || window_->SequenceLength(seq) != s.verify.pos0 + s.verify.n_rows) {
    return;
  }
  // Inside the chunk's rollback span, so this cannot be refused; if it were, the session is
  // simply not kept.
  if (!window_->TruncateSequence(seq, s.verify.pos0 + 1).ok()) s.keep = false;
  s.verify = VerifySpan{};
}

}  // namespace kvasir::ring
