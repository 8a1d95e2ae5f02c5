// CPU kernels of the gated DeltaNet token mixer (qwen35): the short causal convolution and the
// delta-rule recurrence, each over one sequence's rows in order. Behind Backend::CausalConvSilu
// and Backend::GatedDeltaRule, whose comments give the math. Both run rows strictly one after the
// other, so a sequence gives the same bits whether its rows come in one batch or one at a time.
#pragma once

#include <cstdint>

#include "base/thread_pool.h"

namespace kvasir::cpu {

// Channels are split across the pool. Shapes as Backend::CausalConvSilu (backend/backend.h).
void CpuCausalConvSilu(const float* x, int n, int channels, int kernel, const float* w,
                       float* state, float* out, ThreadPool& pool);

// Value heads are split across the pool. Shapes as Backend::GatedDeltaRule.
void CpuGatedDeltaRule(const float* qkv, int64_t row_stride, const float* alpha, const float* beta,
                       const float* dt_bias, const float* a, int n, int n_k_heads, int n_v_heads,
                       int dim, float eps, float* state, float* out, ThreadPool& pool);

}  // namespace kvasir::cpu
