// LayerWindow behaviour on small models written by the test: batching and windows are exact,
// only the window's tensors become resident, and bad requests are refused with clear errors.
#include <gtest/gtest.h>

#include "base/mapped_file.h"
#include "model/layer_window.h"
#include "test_assets.h"
#include "tiny_model.h"

namespace kvasir {
namespace {

using testing::TempDir;
using testing::TinyModelShape;
using testing::WriteTinyModel;

using testing::OpenShared;

std::unique_ptr<LayerWindow> Load(std::shared_ptr<const GgufFile> f, WindowSpec spec,
                                  int n_threads = 1) {
  return testing::LoadWindow(std::move(f), spec, /*n_ctx=*/64, n_threads);
}

const std::vector<int32_t> kPrompt = {1, 17, 42, 5, 88, 23, 61, 9, 30, 77, 2};

class LayerWindowTest : public ::testing::TestWithParam<TensorType> {
 protected:
  void SetUp() override {
    TinyModelShape shape;
    shape.n_layer = 4;
    shape.type = GetParam();
    ASSERT_TRUE(WriteTinyModel(dir_.File("tiny.gguf"), shape).ok());
    file_ = OpenShared(dir_.File("tiny.gguf"));
  }
  TempDir dir_;
  std::shared_ptr<const GgufFile> file_;
};

// Prefill as one batch, as token-by-token steps, or in uneven chunks: the same bits.
TEST_P(LayerWindowTest, ChunkingDoesNotChangeLogits) {
  auto whole = Load(file_, {0, 4, true, true});
  auto steps = Load(file_, {0, 4, true, true}, 2);
  ASSERT_TRUE(whole && steps);
  ASSERT_TRUE(whole->OpenSequence(0).ok());
  ASSERT_TRUE(steps->OpenSequence(0).ok());
  ForwardOutput a, b;
  ASSERT_TRUE(whole->Forward({{{0, 0, static_cast<int>(kPrompt.size())}}, kPrompt, {}, true}, &a).ok());
  std::vector<float> stepped;
  size_t pos = 0;
  for (int chunk : {3, 1, 5, 2}) {
    ForwardInput in{{{0, static_cast<int>(pos), chunk}},
                    std::span<const int32_t>(kPrompt).subspan(pos, chunk), {}, true};
    ASSERT_TRUE(steps->Forward(in, &b).ok());
    stepped.insert(stepped.end(), b.logits.begin(), b.logits.end());
    pos += chunk;
  }
  ASSERT_EQ(a.logits.size(), stepped.size());
  EXPECT_EQ(a.logits, stepped);
}

// Several sequences in one batch give the same logits as each alone.
TEST_P(LayerWindowTest, BatchedSequencesAreIndependent) {
  auto batched = Load(file_, {0, 4, true, true}, 2);
  auto single = Load(file_, {0, 4, true, true});
  ASSERT_TRUE(batched && single);
  const std::vector<int32_t> p1 = {1, 5, 9, 13}, p2 = {1, 60, 61};
  for (int s : {3, 8}) ASSERT_TRUE(batched->OpenSequence(s).ok());
  std::vector<int32_t> both = p1;
  both.insert(both.end(), p2.begin(), p2.end());
  ForwardOutput out;
  ASSERT_TRUE(batched->Forward({{{3, 0, 4}, {8, 0, 3}}, both, {}, false}, &out).ok());
  const int n_vocab = batched->config().n_vocab;
  ASSERT_EQ(out.logits.size(), 2u * n_vocab);
  for (auto [seq, prompt, row] : {std::tuple{0, p1, 0}, std::tuple{1, p2, 1}}) {
    ASSERT_TRUE(single->OpenSequence(seq).ok());
    ForwardOutput one;
    ASSERT_TRUE(
        single->Forward({{{seq, 0, static_cast<int>(prompt.size())}}, prompt, {}, false}, &one).ok());
    std::vector<float> row_logits(out.logits.begin() + row * n_vocab,
                                  out.logits.begin() + (row + 1) * n_vocab);
    EXPECT_EQ(one.logits, row_logits) << "sequence " << seq;
  }
}

// Windows [0,1) + [1,3) + [3,4) chained by hidden states equal the whole model, bit for bit.
TEST_P(LayerWindowTest, ChainedWindowsEqualWholeModel) {
  auto whole = Load(file_, {0, 4, true, true});
  auto a = Load(file_, {0, 1, true, false});
  auto b = Load(file_, {1, 3, false, false});
  auto c = Load(file_, {3, 4, false, true});
  ASSERT_TRUE(whole && a && b && c);
  for (LayerWindow* w : {whole.get(), a.get(), b.get(), c.get()}) {
    ASSERT_TRUE(w->OpenSequence(1).ok());
  }
  const int n = static_cast<int>(kPrompt.size());
  ForwardOutput ref, ha, hb, logits;
  ASSERT_TRUE(whole->Forward({{{1, 0, n}}, kPrompt, {}, true}, &ref).ok());
  ASSERT_TRUE(a->Forward({{{1, 0, n}}, kPrompt, {}, false}, &ha).ok());
  ASSERT_EQ(ha.hidden.size(), static_cast<size_t>(n) * whole->config().n_embd);
  ASSERT_TRUE(b->Forward({{{1, 0, n}}, {}, ha.hidden, false}, &hb).ok());
  ASSERT_TRUE(c->Forward({{{1, 0, n}}, {}, hb.hidden, true}, &logits).ok());
  EXPECT_EQ(ref.logits, logits.logits);
}

INSTANTIATE_TEST_SUITE_P(Types, LayerWindowTest,
                         ::testing::Values(TensorType::kF32, TensorType::kF16, TensorType::kBF16,
                                           TensorType::kQ8_0, TensorType::kQ4_0),
                         [](const auto& info) { return TensorTypeName(static_cast<uint32_t>(info.param)); });

TEST(LayerWindowErrors, RefusesBadRequests) {
  TempDir dir;
  ASSERT_TRUE(WriteTinyModel(dir.File("m.gguf"), {}).ok());
  auto file = OpenShared(dir.File("m.gguf"));
  auto bad = LayerWindow::Load(file, {1, 5, false, true}, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layers 1:5"), std::string::npos) << bad.status().message();

  auto w = Load(file, {0, 2, true, true});
  ASSERT_NE(w, nullptr);
  ForwardOutput out;
  const std::vector<int32_t> ids = {1, 2, 3};
  auto msg = [&](const ForwardInput& in) { return w->Forward(in, &out).message(); };
  EXPECT_NE(msg({{{5, 0, 3}}, ids, {}, false}).find("sequence 5 is not open"), std::string::npos);
  ASSERT_TRUE(w->OpenSequence(5).ok());
  EXPECT_FALSE(w->OpenSequence(5).ok());
  EXPECT_NE(msg({{{5, 2, 3}}, ids, {}, false}).find("position 2"), std::string::npos);
  EXPECT_NE(msg({{{5, 0, 2}}, ids, {}, false}).find("3 token ids"), std::string::npos);
  const std::vector<int32_t> bad_ids = {1, 96, 3};
  EXPECT_NE(msg({{{5, 0, 3}}, bad_ids, {}, false}).find("token id 96"), std::string::npos);
  std::vector<int32_t> long_ids(65, 1);
  EXPECT_NE(msg({{{5, 0, 65}}, long_ids, {}, false}).find("exceed the context of 64"),
            std::string::npos);
  // A refused batch leaves the sequence untouched.
  EXPECT_EQ(w->SequenceLength(5), 0);
  EXPECT_TRUE(w->Forward({{{5, 0, 3}}, ids, {}, false}, &out).ok());
  EXPECT_EQ(w->SequenceLength(5), 3);
  w->CloseSequence(5);
  EXPECT_EQ(w->SequenceLength(5), -1);
}

TEST(LayerWindowErrors, UnsupportedArchitectureIsNamed) {
  TempDir dir;
  TinyModelShape shape;
  shape.arch = "mamba";
  ASSERT_TRUE(WriteTinyModel(dir.File("m.gguf"), shape).ok());
  auto w = LayerWindow::Load(OpenShared(dir.File("m.gguf")), {0, 2, true, true}, {});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("architecture 'mamba' is not supported"), std::string::npos)
      << w.status().message();
}

// A window of one layer of an 8-layer model: the process's resident memory grows by about that
// layer's bytes, not the model's.
TEST(LayerWindowMemory, OnlyTheWindowBecomesResident) {
  TempDir dir;
  TinyModelShape shape;
  shape.n_layer = 8;
  shape.n_embd = 512;
  shape.n_head = 8;
  shape.n_head_kv = 8;
  shape.n_ff = 1536;
  shape.n_vocab = 512;
  ASSERT_TRUE(WriteTinyModel(dir.File("big.gguf"), shape).ok());
  auto file = OpenShared(dir.File("big.gguf"));
  const size_t before = CurrentRssBytes();
  auto w = Load(file, {3, 4, false, false});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->OpenSequence(0).ok());
  std::vector<float> hidden(4 * 512, 0.5f);
  ForwardOutput out;
  ASSERT_TRUE(w->Forward({{{0, 0, 4}}, {}, hidden, false}, &out).ok());
  const size_t grown = CurrentRssBytes() - before;
  const uint64_t layer_bytes = w->weight_bytes();
  std::printf("window weights %.1f MiB, file %.1f MiB, RSS grew %.1f MiB\n", layer_bytes / 1048576.0,
              file->file_size() / 1048576.0, grown / 1048576.0);
  EXPECT_GT(file->file_size(), layer_bytes * 6);  // the file is much bigger than the window
  EXPECT_LT(grown, layer_bytes + (4u << 20)) << "RSS grew by more than the window's weights";
}

}  // namespace
}  // namespace kvasir
