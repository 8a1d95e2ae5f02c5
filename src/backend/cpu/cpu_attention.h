// CPU attention over one sequence's KV cache (Backend::Attention): each KV head's keys packed in
// blocks once per call (kernels/attention_tiles.h), then units of a few query tokens by a share of
// the head's query group split across the pool, with a unit's scores in a per-thread buffer.
#pragma once

#include "backend/backend.h"
#include "base/thread_pool.h"

namespace kvasir::cpu {

// q, out: [n, n_head * head_dim]; k, v: [>= pos0 + n, n_head_kv * head_dim]. Options as
// AttentionParams (scale, soft-cap, sliding window). A row's result does not depend on n.
void CpuAttention(const float* q, int n, int pos0, const float* k, const float* v,
                  const AttentionParams& p, float* out, ThreadPool& pool);

// CpuAttention with keys, values, queries and softmax weights rounded to bf16 and f32 sums
// (kernels/attention_bf16.h): the backend's --attn-type bf16. Only where HaveBf16Attention().
void CpuAttentionBf16(const float* q, int n, int pos0, const float* k, const float* v,
                      const AttentionParams& p, float* out, ThreadPool& pool);

}  // namespace kvasir::cpu
