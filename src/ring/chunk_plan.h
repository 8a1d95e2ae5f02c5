// How the head cuts a prompt's new rows into chunks (docs/ARCHITECTURE.md, "Prompt chunks"). A
// chunk crosses the stages one after another, and the next chunk runs on a stage while the one
// before it runs on the next stage: a prompt in several chunks is pipelined. A fresh short prompt
// should stay one chunk (each chunk pays its own pass over the weights), while a long cached
// continuation, whose rows attend to every cached position, should be cut so that the stages
// share its work. So the cap is by work, not only by rows. Pure: tested alone
// (tests/ring/chunk_plan_test.cpp).
#pragma once

#include <vector>

#include "backend/backend.h"  // AttnType
#include "model/model_config.h"

namespace kvasir::ring {

// The work of one prompt row through the whole model, in units of a weight multiply-add: a row at
// position p costs per_row + per_position * (the positions it attends to: p + 1, at most
// attn_window when that is > 0).
struct RowCost {
  double per_row = 0;       // its pass over the weights of every layer
  double per_position = 0;  // each position the attention layers attend to
  int attn_window = 0;      // > 0: a row attends to at most this many positions
};

// From the model's shape (all its layers: a chunk crosses every stage). per_row counts the
// projections of attention and DeltaNet layers, a DeltaNet layer's recurrent update, and the FFN
// (of an MoE layer: the router, the experts a row uses and the shared expert). per_position
// counts the attention layers only (DeltaNet layers attend to nothing): 2 * n_head * head_dim
// multiply-adds (scores and weighted values) per layer, times what an attention multiply-add
// costs against a weight one. The matrix products of quantized weights run on 8-bit integer dot
// products (four multiply-adds per 32-bit lane), attention on f32 lanes (one) or bf16 pairs (two):
// an attended multiply-add counts 4 (f32) or 2 (bf16) weight ones. On the bench model's CPU this
// is what was measured: about 136 G weight multiply-adds a second in a prefill against 35 to 39
// (f32 attention) and 66 (bf16) G (docs/PERFORMANCE.md).
RowCost RowCostOf(const ModelConfig& cfg, AttnType attn_type);

// The cost of the `n` rows at positions [n_cached, n_cached + n).
double RowsCost(const RowCost& cost, int n_cached, int n);

// Enough chunks to keep a ring's stages busy: the work cuts a prompt into at most this many, and
// a prompt the row cap alone cuts into this many or more is not cut further (each chunk pays its
// own pass over the weights: a long fresh prompt would only cost more).
inline constexpr int kPipelineChunks = 4;

// The sizes, in order, of the chunks that `n_new` rows after `n_cached` cached positions are cut
// into: as few chunks as keep each within `max_rows` rows and, within about a row, within the
// budget of the cost of `max_rows` fresh rows (positions [0, max_rows)) as far as
// kPipelineChunks allow, and of near-equal cost (a short last chunk would cross every stage
// behind the others instead of sharing their work).
// None is empty; they sum to n_new; a fresh prompt of at most max_rows rows is one chunk. Empty
// when n_new <= 0. Requires max_rows >= 1, n_cached >= 0.
std::vector<int> PlanChunks(const RowCost& cost, int n_cached, int n_new, int max_rows);

}  // namespace kvasir::ring
