// CPU mixture-of-experts ops (Backend::MoeRoute, Backend::MoeFfn): routing row by row, then each
// used expert once over the rows routed to it (grouped by a counting sort), so decode rows of many
// sessions share one pass over an expert's weights. A row's result depends only on the row.
#pragma once

#include <cstdint>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/kernels.h"

namespace kvasir::cpu {

// Shapes as Backend::MoeRoute.
void CpuMoeRoute(float* logits, int n, int n_expert, int k, int32_t* ids, float* weights);

// Grows-only buffers of CpuMoeFfn, kept by the backend across calls.
struct MoeScratch {
  std::vector<int> slot;            // [n * k]: row-slots grouped by expert
  std::vector<int> pos;             // [n * k]: each row-slot's place in that order
  std::vector<int> start;           // [n_expert + 1]: first grouped row-slot of each expert
  std::vector<int> fill;            // [n_expert]: next free grouped row-slot of each expert
  std::vector<float> in, gate, up;  // one expert's rows: [m, n_embd], [m, n_ff], [m, n_ff]
  std::vector<float> out;           // [n * k, n_embd]: expert outputs in grouped order
};

// gate, up: n_expert views of [n_ff, n_embd]; down: n_expert views of [n_embd, n_ff]. Shapes
// otherwise as Backend::MoeFfn.
void CpuMoeFfn(const std::vector<MatrixView>& gate, const std::vector<MatrixView>& up,
               const std::vector<MatrixView>& down, const float* in, int n, const int32_t* ids,
               const float* weights, int k, float* out, ThreadPool& pool, MoeScratch& s);

}  // namespace kvasir::cpu
