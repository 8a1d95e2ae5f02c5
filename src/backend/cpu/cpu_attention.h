// CPU attention over one sequence's KV cache (Backend::Attention): each (query row, head) pair on
// its own, split across the pool, with the scores of a pair in a per-thread buffer.
#pragma once

#include "backend/backend.h"
#include "base/thread_pool.h"

namespace kvasir::cpu {

// q, out: [n, n_head * head_dim]; k, v: [>= pos0 + n, n_head_kv * head_dim]. Options as
// AttentionParams (scale, soft-cap, sliding window). A row's result does not depend on n.
void CpuAttention(const float* q, int n, int pos0, const float* k, const float* v,
                  const AttentionParams& p, float* out, ThreadPool& pool);

}  // namespace kvasir::cpu
