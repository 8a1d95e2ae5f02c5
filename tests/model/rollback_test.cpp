// Rolling a sequence back (LayerWindow::TruncateSequence within a rollback span), as a speculative
// verify batch does: on a llama-family model (attention only: the cache just truncates) and on
// the hybrid Qwen3.5 MoE fixture (DeltaNet states restored from checkpoints), the rows run after
// a rollback give the same logits, bit for bit, as a run that never saw the rejected rows.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "test_assets.h"
#include "tiny_model.h"

namespace kvasir {
namespace {

using testing::AssetPath;

std::unique_ptr<LayerWindow> LoadWhole(const std::string& rel, int max_checkpoints = 8) {
  auto file = testing::OpenShared(AssetPath(rel));
  if (file == nullptr) return nullptr;
  auto cfg = LoadModelConfig(*file);
  EXPECT_TRUE(cfg.ok()) << cfg.status().message();
  if (!cfg.ok()) return nullptr;
  WindowOptions opt;
  opt.n_ctx = 128;
  opt.n_threads = 2;
  opt.max_checkpoints = max_checkpoints;
  auto w = LayerWindow::Load(std::move(file), {0, cfg->n_layer, true, true}, opt);
  EXPECT_TRUE(w.ok()) << w.status().message();
  return w.ok() ? std::move(*w) : nullptr;
}

// n token ids that differ from each other, inside a vocabulary of n_vocab.
std::vector<int32_t> Ids(int n, int salt, int n_vocab) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i)
    ids.push_back(static_cast<int32_t>((i * 37 + salt * 11 + 1) % n_vocab));
  return ids;
}

// Runs ids[pos0, pos0 + n) of sequence `seq` with logits for every row; n_checkpoints as given.
std::vector<float> Feed(LayerWindow& w, int seq, const std::vector<int32_t>& ids, int pos0, int n,
                        int n_checkpoints = 0) {
  ForwardInput in;
  SeqChunk ch{seq, pos0, n};
  ch.n_checkpoints = n_checkpoints;
  in.chunks = {ch};
  in.tokens = std::span<const int32_t>(ids).subspan(pos0, n);
  in.all_logits = true;
  ForwardOutput out;
  const Status st = w.Forward(in, &out);
  EXPECT_TRUE(st.ok()) << st.message();
  return out.logits;
}

// The logits rows [from, to) of a [rows, n_vocab] block.
std::vector<float> Rows(const std::vector<float>& logits, int n_vocab, int from, int to) {
  return std::vector<float>(logits.begin() + static_cast<size_t>(from) * n_vocab,
                            logits.begin() + static_cast<size_t>(to) * n_vocab);
}

bool Recurrent(const ModelConfig& cfg) {
  for (int il = 0; il < cfg.n_layer; ++il) {
    if (cfg.layer_kind(il) == LayerKind::kDeltaNet) return true;
  }
  return false;
}

class RollbackTest : public ::testing::TestWithParam<const char*> {};

// A verify batch of K + 1 rows of which only the first j match the true continuation: after
// keeping prefix + j rows and running the rest of the true tokens, every row's logits equal a
// fresh run's, for every j.
TEST_P(RollbackTest, RowsAfterARollbackEqualAFreshRun) {
  KV_REQUIRE_ASSET(GetParam());
  auto w = LoadWhole(GetParam());
  ASSERT_NE(w, nullptr);
  const int n_vocab = w->config().n_vocab;
  constexpr int kPrefix = 7, kVerify = 5, kTotal = 16;
  const std::vector<int32_t> truth = Ids(kTotal, 1, n_vocab);
  ASSERT_TRUE(w->OpenSequence(0).ok());
  const std::vector<float> fresh = Feed(*w, 0, truth, 0, kTotal);
  ASSERT_EQ(fresh.size(), static_cast<size_t>(kTotal) * n_vocab);

  for (int j = 0; j <= kVerify; ++j) {
    SCOPED_TRACE("rows kept of the verify batch: " + std::to_string(j));
    const int seq = 1 + j;
    ASSERT_TRUE(w->OpenSequence(seq).ok());
    Feed(*w, seq, truth, 0, kPrefix);
    std::vector<int32_t> guess = truth;  // wrong from row kPrefix + j on
    for (int r = kPrefix + j; r < kPrefix + kVerify; ++r) guess[r] = (truth[r] + 5) % n_vocab;
    const std::vector<float> verify = Feed(*w, seq, guess, kPrefix, kVerify, kVerify);
    EXPECT_EQ(w->RollbackFloor(seq), Recurrent(w->config()) ? kPrefix : 0);
    ASSERT_TRUE(w->TruncateSequence(seq, kPrefix + j).ok());
    EXPECT_EQ(w->SequenceLength(seq), kPrefix + j);
    const std::vector<float> rest = Feed(*w, seq, truth, kPrefix + j, kTotal - kPrefix - j);
    EXPECT_EQ(Rows(verify, n_vocab, 0, j), Rows(fresh, n_vocab, kPrefix, kPrefix + j));
    EXPECT_EQ(rest, Rows(fresh, n_vocab, kPrefix + j, kTotal));
    w->CloseSequence(seq);
  }
}

// Two verify batches in a row extend one span: a miss in the first rolls both back.
TEST_P(RollbackTest, ConsecutiveVerifyBatchesExtendTheSpan) {
  KV_REQUIRE_ASSET(GetParam());
  auto w = LoadWhole(GetParam());
  ASSERT_NE(w, nullptr);
  const int n_vocab = w->config().n_vocab;
  const std::vector<int32_t> truth = Ids(14, 2, n_vocab);
  ASSERT_TRUE(w->OpenSequence(0).ok());
  const std::vector<float> fresh = Feed(*w, 0, truth, 0, 14);
  ASSERT_TRUE(w->OpenSequence(1).ok());
  std::vector<int32_t> guess = truth;
  for (int r = 6; r < 12; ++r) guess[r] = (truth[r] + 3) % n_vocab;
  Feed(*w, 1, truth, 0, 5);
  Feed(*w, 1, guess, 5, 3, 3);  // rows 5..7: row 5 true, 6 and 7 wrong
  Feed(*w, 1, guess, 8, 3, 3);  // rows 8..10, built on the wrong ones
  ASSERT_TRUE(w->TruncateSequence(1, 6).ok());
  EXPECT_EQ(Feed(*w, 1, truth, 6, 8), Rows(fresh, n_vocab, 6, 14));
}

// After many rejected batches the sequence carries no trace of them.
TEST_P(RollbackTest, ManyRejectionsLeaveNoTrace) {
  KV_REQUIRE_ASSET(GetParam());
  auto w = LoadWhole(GetParam());
  ASSERT_NE(w, nullptr);
  const int n_vocab = w->config().n_vocab;
  constexpr int kTotal = 24;
  const std::vector<int32_t> truth = Ids(kTotal, 3, n_vocab);
  ASSERT_TRUE(w->OpenSequence(0).ok());
  const std::vector<float> fresh = Feed(*w, 0, truth, 0, kTotal);
  ASSERT_TRUE(w->OpenSequence(1).ok());
  Feed(*w, 1, truth, 0, 4);
  // One true row per step, then three wrong ones that are rolled back.
  for (int pos = 4; pos < kTotal - 4; ++pos) {
    std::vector<int32_t> guess = truth;
    for (int r = pos + 1; r < pos + 4; ++r) guess[r] = (truth[r] + 7 + pos) % n_vocab;
    Feed(*w, 1, guess, pos, 4, 4);
    ASSERT_TRUE(w->TruncateSequence(1, pos + 1).ok());
  }
  EXPECT_EQ(Feed(*w, 1, truth, kTotal - 4, 4), Rows(fresh, n_vocab, kTotal - 4, kTotal));
}

INSTANTIATE_TEST_SUITE_P(Models, RollbackTest,
                         ::testing::Values("models/stories260K.gguf",
                                           "models/synth-llama-q4_k_m.gguf",
                                           "models/synth-qwen35moe-f32.gguf"));

constexpr char kHybrid[] = "models/synth-qwen35moe-f32.gguf";

// What lies outside the span is refused by name, and leaves the sequence as it was.
TEST(RollbackRefusalTest, OutsideTheSpanIsRefused) {
  KV_REQUIRE_ASSET(kHybrid);
  auto w = LoadWhole(kHybrid, /*max_checkpoints=*/4);
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> ids = Ids(20, 4, w->config().n_vocab);
  ASSERT_TRUE(w->OpenSequence(0).ok());
  Feed(*w, 0, ids, 0, 6);
  Feed(*w, 0, ids, 6, 4, 3);  // checkpoints before rows 7, 8, 9
  EXPECT_EQ(w->RollbackFloor(0), 7);
  Status st = w->TruncateSequence(0, 6);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cannot keep 6 of 10 positions: layer 0 keeps a recurrent state"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("rollback span 7..10"), std::string::npos) << st.message();
  EXPECT_EQ(w->SequenceLength(0), 10);

  // More checkpoints than the window keeps, or than the chunk has rows.
  ForwardInput in;
  SeqChunk ch{0, 10, 5};
  ch.n_checkpoints = 5;
  in.chunks = {ch};
  in.tokens = std::span<const int32_t>(ids).subspan(10, 5);
  ForwardOutput out;
  st = w->Forward(in, &out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("5 checkpoints asked for a chunk of 5 tokens"), std::string::npos)
      << st.message();
  in.chunks[0].n_tokens = 2;
  in.chunks[0].n_checkpoints = 3;
  in.tokens = std::span<const int32_t>(ids).subspan(10, 2);
  EXPECT_FALSE(w->Forward(in, &out).ok());

  // A batch without checkpoints empties the span; clearing still works.
  Feed(*w, 0, ids, 10, 2);
  EXPECT_EQ(w->RollbackFloor(0), 12);
  EXPECT_FALSE(w->TruncateSequence(0, 11).ok());
  EXPECT_TRUE(w->TruncateSequence(0, 0).ok());
  EXPECT_EQ(w->SequenceLength(0), 0);
}

// Extending past max_checkpoints drops the oldest checkpoints.
TEST(RollbackRefusalTest, SpanKeepsAtMostMaxCheckpoints) {
  KV_REQUIRE_ASSET(kHybrid);
  auto w = LoadWhole(kHybrid, /*max_checkpoints=*/4);
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> ids = Ids(20, 5, w->config().n_vocab);
  ASSERT_TRUE(w->OpenSequence(0).ok());
  Feed(*w, 0, ids, 0, 4);
  Feed(*w, 0, ids, 4, 3, 3);
  EXPECT_EQ(w->RollbackFloor(0), 4);
  Feed(*w, 0, ids, 7, 3, 3);
  EXPECT_EQ(w->RollbackFloor(0), 6);
  EXPECT_FALSE(w->TruncateSequence(0, 5).ok());
  EXPECT_TRUE(w->TruncateSequence(0, 6).ok());
}

}  // namespace
}  // namespace kvasir
