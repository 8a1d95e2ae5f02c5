// The batch former and the whole-or-each forward runner of a stage.
#include "ring/scheduler.h"

#include <algorithm>
#include <set>

namespace kvasir::ring {

std::vector<Work> BatchScheduler::NextBatch(const std::function<bool(uint32_t)>& live) {
  std::vector<Work> batch;
  std::set<uint32_t> seen;  // sessions in this batch, or held back for the next one
  int rows = 0;
  auto take = [&](std::deque<Work>& q) {
    for (auto it = q.begin(); it != q.end();) {
      if (!live(it->session)) {  // the session ended meanwhile
        it = q.erase(it);
        continue;
      }
      if (seen.count(it->session) != 0) {
        ++it;
        continue;
      }
      seen.insert(it->session);
      if (rows > 0 && rows + it->n_tokens > max_rows_) {
        ++it;  // waits for the next batch, and so do the session's later items
        continue;
      }
      rows += it->n_tokens;
      batch.push_back(std::move(*it));
      it = q.erase(it);
    }
  };
  take(decode_);
  take(prefill_);
  return batch;
}

std::vector<Work> BatchScheduler::TakeSession(uint32_t session) {
  std::vector<Work> out;
  for (std::deque<Work>* q : {&prefill_, &decode_}) {
    for (auto it = q->begin(); it != q->end();) {
      if (it->session != session) {
        ++it;
        continue;
      }
      out.push_back(std::move(*it));
      it = q->erase(it);
    }
  }
  // Not sorted by position: with overlap a verify chunk that rolls back into the one before it
  // was sent after it, and runs after it.
  return out;
}

void BuildForwardInput(std::span<const Work> items, ForwardInput* in, std::vector<int32_t>* tokens,
                       std::vector<float>* hidden) {
  in->chunks.clear();
  tokens->clear();
  hidden->clear();
  for (const Work& w : items) {
    SeqChunk ch{static_cast<int>(w.session), w.pos0, w.n_tokens};
    ch.want_logits = w.sample;
    if (w.verify) {
      ch.every_logits = true;
      ch.n_checkpoints = w.n_tokens;
    }
    in->chunks.push_back(ch);
    tokens->insert(tokens->end(), w.tokens.begin(), w.tokens.end());
    hidden->insert(hidden->end(), w.hidden.begin(), w.hidden.end());
  }
  in->tokens = *tokens;
  in->hidden = *hidden;
}

bool RunBatchOrEach(std::span<const Work> batch, const ForwardFn& forward,
                    const std::function<void(std::span<const Work>, const ForwardOutput&)>& done,
                    const std::function<void(const Work&, const Status&)>& failed) {
  if (batch.empty()) return true;
  ForwardOutput out;
  Status whole = forward(batch, &out);
  if (whole.ok()) {
    done(batch, out);
    return true;
  }
  if (batch.size() == 1) {
    failed(batch[0], whole);
    return false;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    std::span<const Work> one = batch.subspan(i, 1);
    ForwardOutput o;
    if (Status s = forward(one, &o); !s.ok()) {
      failed(batch[i], s);
      continue;
    }
    done(one, o);
  }
  return false;
}

}  // namespace kvasir::ring
