// The head's prompt chunks (src/ring/chunk_plan.h) alone: how many, how large, and what a row
// costs on dense, hybrid and MoE shapes.
#include "ring/chunk_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace kvasir::ring {
namespace {

// The bench model's shape (docs/PERFORMANCE.md, "The bench model"): TinyLlama's, 8 layers.
ModelConfig BenchShape() {
  ModelConfig c;
  c.n_layer = 8;
  c.n_embd = 2048;
  c.n_head = 32;
  c.n_head_kv = 4;
  c.head_dim = 64;
  c.n_ff = 5632;
  return c;
}

int Sum(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0); }

TEST(ChunkPlanTest, AFreshShortPromptIsOneChunk) {
  const RowCost cost = RowCostOf(BenchShape(), AttnType::kF32);
  EXPECT_EQ(PlanChunks(cost, 0, 20, 64), std::vector<int>{20});
  EXPECT_EQ(PlanChunks(cost, 0, 52, 64), std::vector<int>{52});
  EXPECT_EQ(PlanChunks(cost, 0, 64, 64), std::vector<int>{64});
  EXPECT_EQ(PlanChunks(cost, 0, 64, 52).size(), 2u);  // the row cap still holds
}

TEST(ChunkPlanTest, ALongCachedContinuationOnTheBenchModelIsCutForThePipeline) {
  const RowCost cost = RowCostOf(BenchShape(), AttnType::kF32);
  // Turn 2 of the prompt-cache bench: 57 new rows after 1,627 cached positions (53 after 1,612
  // at the least), one chunk by rows alone.
  for (const auto& [n_cached, n_new] : {std::pair{1627, 57}, std::pair{1612, 53}}) {
    const std::vector<int> plan = PlanChunks(cost, n_cached, n_new, 64);
    EXPECT_GE(plan.size(), 2u) << n_cached << " + " << n_new;
    EXPECT_LE(plan.size(), 4u) << n_cached << " + " << n_new;
    EXPECT_EQ(Sum(plan), n_new);
    EXPECT_LE(
        *std::max_element(plan.begin(), plan.end()) - *std::min_element(plan.begin(), plan.end()),
        1);
  }
  EXPECT_EQ(PlanChunks(cost, 1627, 57, 64), (std::vector<int>{29, 28}));
  // A short history is not worth cutting.
  EXPECT_EQ(PlanChunks(cost, 100, 57, 64).size(), 1u);
}

TEST(ChunkPlanTest, CutEquallyByRowsWhenRowsCostAlike) {
  const RowCost cost = RowCostOf(BenchShape(), AttnType::kF32);
  EXPECT_EQ(PlanChunks(cost, 0, 9, 4), (std::vector<int>{3, 3, 3}));   // not 4 + 4 + 1
  EXPECT_EQ(PlanChunks(cost, 0, 66, 64), (std::vector<int>{33, 33}));  // not 64 + 2
  RowCost flat;
  flat.per_row = 1;
  const std::vector<int> plan = PlanChunks(flat, 500, 10, 4);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(Sum(plan), 10);
  EXPECT_EQ(*std::max_element(plan.begin(), plan.end()), 4);
  EXPECT_EQ(*std::min_element(plan.begin(), plan.end()), 3);
  EXPECT_TRUE(PlanChunks(flat, 0, 0, 4).empty());
}

// Every plan covers the rows in order, none empty, none over the row cap; its chunks' costs are
// within a row's cost of an equal share (when the row cap does not shape them) and of the budget.
TEST(ChunkPlanTest, ChunksCoverTheRowsWithinTheCapsAtNearEqualCost) {
  const RowCost costs[] = {RowCostOf(BenchShape(), AttnType::kF32), RowCost{1.0, 0.5, 0},
                           RowCost{1.0, 0.01, 100}};
  for (const RowCost& cost : costs) {
    for (int n_cached : {0, 3, 100, 1000, 4000}) {
      for (int max_rows : {1, 4, 16, 64, 10000}) {
        for (int n_new = 1; n_new <= 300; n_new += n_new < 20 ? 1 : 37) {
          const std::vector<int> plan = PlanChunks(cost, n_cached, n_new, max_rows);
          ASSERT_FALSE(plan.empty());
          EXPECT_EQ(Sum(plan), n_new);
          const double total = RowsCost(cost, n_cached, n_new);
          const double budget = RowsCost(cost, 0, max_rows);
          const double row = RowsCost(cost, n_cached + n_new - 1, 1);  // the dearest row
          const bool capped = *std::max_element(plan.begin(), plan.end()) == max_rows;
          int pos = n_cached;
          for (const int rows : plan) {
            ASSERT_GE(rows, 1);
            EXPECT_LE(rows, max_rows);
            const double c = RowsCost(cost, pos, rows);
            if (plan.size() > 1 && plan.size() < static_cast<size_t>(kPipelineChunks)) {
              EXPECT_LE(c, budget + row * 1.0001) << rows;
            }
            if (!capped) {
              EXPECT_NEAR(c, total / static_cast<double>(plan.size()), row * 1.0001);
            }
            pos += rows;
          }
        }
      }
    }
  }
}

// A long fresh prompt is cut by its rows alone (the pipeline is full already, and a chunk more
// is a pass over the weights more), and however much a continuation attends to, the work cuts it
// into at most kPipelineChunks.
TEST(ChunkPlanTest, TheWorkAddsNoChunkBeyondWhatFillsThePipeline) {
  const RowCost cost = RowCostOf(BenchShape(), AttnType::kF32);
  const std::vector<int> fresh = PlanChunks(cost, 0, 1591, 64);
  EXPECT_EQ(fresh.size(), 25u);
  EXPECT_EQ(Sum(fresh), 1591);
  EXPECT_EQ(PlanChunks(cost, 0, 1612, 64).size(), 26u);
  const std::vector<int> deep = PlanChunks(cost, 30000, 57, 64);
  EXPECT_EQ(deep.size(), static_cast<size_t>(kPipelineChunks));
  EXPECT_EQ(Sum(deep), 57);
}

TEST(ChunkPlanTest, MoreWorkIsNeverFewerChunks) {
  const RowCost cost = RowCostOf(BenchShape(), AttnType::kF32);
  for (int max_rows : {8, 64}) {
    size_t last = 0;
    for (int n_cached = 0; n_cached <= 8000; n_cached += 97) {
      const size_t n = PlanChunks(cost, n_cached, 57, max_rows).size();
      EXPECT_GE(n, last) << n_cached;
      last = n;
    }
    last = 0;
    for (int n_new = 1; n_new <= 400; ++n_new) {
      const size_t n = PlanChunks(cost, 1627, n_new, max_rows).size();
      EXPECT_GE(n, last) << n_new;
      last = n;
    }
  }
}

TEST(ChunkPlanTest, DeltaNetLayersAttendToNothing) {
  ModelConfig hybrid = BenchShape();
  hybrid.ssm_conv_kernel = 4;
  hybrid.ssm_state = 128;
  hybrid.ssm_n_k_heads = 16;
  hybrid.ssm_n_v_heads = 32;
  hybrid.ssm_inner = 32 * 128;
  // Three DeltaNet layers to an attention layer, as qwen35.
  for (int il = 0; il < hybrid.n_layer; ++il) {
    hybrid.layer_kinds.push_back(il % 4 == 3 ? LayerKind::kAttention : LayerKind::kDeltaNet);
  }
  const RowCost dense = RowCostOf(BenchShape(), AttnType::kF32);
  const RowCost mixed = RowCostOf(hybrid, AttnType::kF32);
  EXPECT_DOUBLE_EQ(mixed.per_position, dense.per_position / 4);
  hybrid.layer_kinds.assign(8, LayerKind::kDeltaNet);
  const RowCost recurrent = RowCostOf(hybrid, AttnType::kF32);
  EXPECT_EQ(recurrent.per_position, 0);
  EXPECT_GT(recurrent.per_row, 0);
  // Without attention, the cached positions cost nothing: rows alone decide.
  EXPECT_EQ(PlanChunks(recurrent, 100000, 57, 64).size(), 1u);
  EXPECT_EQ(PlanChunks(recurrent, 100000, 66, 64), (std::vector<int>{33, 33}));
}

TEST(ChunkPlanTest, AnMoeRowPassesOnlyTheExpertsItUses) {
  ModelConfig moe = BenchShape();
  moe.n_expert = 64;
  moe.n_expert_used = 4;
  moe.n_ff_exp = 512;
  ModelConfig dense = BenchShape();
  dense.n_ff = 4 * 512;
  const double router = 64.0 * 2048 * 8;  // [n_expert, n_embd] per layer
  EXPECT_DOUBLE_EQ(RowCostOf(moe, AttnType::kF32).per_row,
                   RowCostOf(dense, AttnType::kF32).per_row + router);
  moe.n_ff_shexp = 1024;  // and the shared expert, with its [1, n_embd] gate
  EXPECT_DOUBLE_EQ(
      RowCostOf(moe, AttnType::kF32).per_row,
      RowCostOf(dense, AttnType::kF32).per_row + router + 8.0 * (3.0 * 2048 * 1024 + 2048));
}

TEST(ChunkPlanTest, RowCostFollowsTheShape) {
  const ModelConfig c = BenchShape();
  const RowCost f32 = RowCostOf(c, AttnType::kF32);
  // q, k, v, o and the FFN's three matrices, 8 layers.
  EXPECT_DOUBLE_EQ(f32.per_row,
                   8.0 * (2048.0 * (2048 + 2 * 256) + 2048.0 * 2048 + 3.0 * 2048 * 5632));
  // Scores and values: 2 * 32 * 64 multiply-adds per position and layer, weighed 4 (f32).
  EXPECT_DOUBLE_EQ(f32.per_position, 8.0 * 4 * 2 * 32 * 64);
  EXPECT_DOUBLE_EQ(RowCostOf(c, AttnType::kBf16).per_position, f32.per_position / 2);
  // A row at position p attends to p + 1 positions.
  EXPECT_DOUBLE_EQ(RowsCost(f32, 0, 2), 2 * f32.per_row + 3 * f32.per_position);
  EXPECT_DOUBLE_EQ(RowsCost(f32, 10, 1), f32.per_row + 11 * f32.per_position);
}

TEST(ChunkPlanTest, ASlidingWindowCapsThePositionsARowAttendsTo) {
  ModelConfig c = BenchShape();
  c.attn_window = 4096;
  const RowCost cost = RowCostOf(c, AttnType::kF32);
  EXPECT_DOUBLE_EQ(RowsCost(cost, 5000, 1), RowsCost(cost, 20000, 1));
  EXPECT_DOUBLE_EQ(RowsCost(cost, 4094, 3),
                   3 * cost.per_row + (4095.0 + 4096 + 4096) * cost.per_position);
  EXPECT_EQ(PlanChunks(cost, 20000, 57, 64), PlanChunks(cost, 100000, 57, 64));
}

}  // namespace
}  // namespace kvasir::ring
