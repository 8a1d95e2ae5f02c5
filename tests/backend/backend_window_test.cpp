// A window on a backend other than the CPU's: the scalar reference backend, which keeps its own
// copy of every weight. The model runs unchanged on it; what it cannot run or hold is refused when
// the window loads; and a batch moves only its input rows, boundary rows and logits between host
// and backend.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "backend/reference_backend.h"
#include "backend/registry.h"
#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "model/tiny_model.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using ::testing::HasSubstr;

constexpr int kCtx = 64;

Result<std::unique_ptr<LayerWindow>> LoadOn(std::unique_ptr<Backend> be, const std::string& path,
                                            WindowSpec spec) {
  WindowOptions o;
  o.n_ctx = kCtx;
  return LayerWindow::Load(testing::OpenShared(path), spec, o, std::move(be));
}

// Logits of every position of `ids`: the prompt in one batch, then two tokens one at a time.
std::vector<float> AllLogits(LayerWindow& w, const std::vector<int32_t>& ids) {
  EXPECT_TRUE(w.OpenSequence(7).ok());
  std::vector<float> all;
  ForwardInput in;
  const int n = static_cast<int>(ids.size()) - 2;
  in.chunks = {{7, 0, n, true}};
  in.tokens = std::span<const int32_t>(ids.data(), n);
  in.all_logits = true;
  ForwardOutput out;
  Status s = w.Forward(in, &out);
  EXPECT_TRUE(s.ok()) << s.message();
  all = out.logits;
  for (int t = n; t < static_cast<int>(ids.size()); ++t) {
    in.chunks = {{7, t, 1, true}};
    in.tokens = std::span<const int32_t>(ids.data() + t, 1);
    s = w.Forward(in, &out);
    EXPECT_TRUE(s.ok()) << s.message();
    all.insert(all.end(), out.logits.begin(), out.logits.end());
  }
  return all;
}

double Nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return err / norm;
}

std::string TinyModel(const testing::TempDir& dir, TensorType type) {
  testing::TinyModelShape shape;
  shape.type = type;
  if (BlockValues(type) == 256) shape.n_embd = shape.n_ff = 256;  // whole superblocks
  const std::string path =
      dir.File(std::string("tiny-") + TensorTypeName(uint32_t(type)) + ".gguf");
  EXPECT_TRUE(testing::WriteTinyModel(path, shape).ok());
  return path;
}

std::unique_ptr<Backend> Cpu() { return std::move(OpenBackend("cpu", {2})).value(); }

TEST(BackendWindowTest, TheModelRunsUnchangedOnAnotherBackend) {
  testing::TempDir dir;
  const std::vector<int32_t> ids = {1, 5, 9, 33, 2, 71, 40};
  for (TensorType type : {TensorType::kF32, TensorType::kQ8_0, TensorType::kQ4_K}) {
    SCOPED_TRACE(TensorTypeName(uint32_t(type)));
    const std::string path = TinyModel(dir, type);
    auto ref = LoadOn(testing::MakeReferenceBackend(), path, {0, 2, true, true});
    auto cpu = LoadOn(Cpu(), path, {0, 2, true, true});
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    ASSERT_TRUE(cpu.ok()) << cpu.status().message();
    EXPECT_EQ((*ref)->device().address, "ref");
    // The reference backend holds its own copy of every weight; the CPU backend reads matrices
    // in place from the mapping and copies only the small vectors (norms).
    EXPECT_GE((*ref)->device_weight_bytes(), (*ref)->weight_bytes());
    EXPECT_LT((*cpu)->device_weight_bytes(), (*cpu)->weight_bytes() / 20);
    const std::vector<float> want = AllLogits(**cpu, ids);
    const std::vector<float> got = AllLogits(**ref, ids);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(Nmse(got, want), 1e-8);
  }
}

// The hybrid stack (DeltaNet, gated attention, routed and shared experts) on the other backend.
TEST(BackendWindowTest, TheHybridMoeStackRunsUnchangedOnAnotherBackend) {
  const std::string path = testing::AssetPath("models/synth-qwen35moe-f32.gguf");
  if (!std::filesystem::exists(path) && !testing::AssetsRequired()) GTEST_SKIP() << path;
  auto cfg = LoadModelConfig(*testing::OpenShared(path));
  ASSERT_TRUE(cfg.ok());
  const WindowSpec all{0, cfg->n_layer, true, true};
  auto ref = LoadOn(testing::MakeReferenceBackend(), path, all);
  auto cpu = LoadOn(Cpu(), path, all);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  const std::vector<int32_t> ids = {1, 450, 496, 173, 170, 432, 291, 8};
  const std::vector<float> want = AllLogits(**cpu, ids);
  const std::vector<float> got = AllLogits(**ref, ids);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(Nmse(got, want), 1e-8);
}

TEST(BackendWindowTest, ABatchMovesOnlyItsInputRowsBoundaryRowsAndLogits) {
  testing::TempDir dir;
  const std::string path = TinyModel(dir, TensorType::kF32);
  const testing::TinyModelShape shape;
  struct Case {
    WindowSpec spec;
    int64_t up_per_row, down_per_row, down_per_logit_row;
  };
  for (const Case& c : {Case{{0, 2, true, true}, 1, 0, shape.n_vocab},
                        Case{{0, 1, true, false}, 1, shape.n_embd, 0},
                        Case{{1, 2, false, false}, shape.n_embd, shape.n_embd, 0},
                        Case{{1, 2, false, true}, shape.n_embd, 0, shape.n_vocab}}) {
    testing::TransferCounts counts;
    auto w = LoadOn(testing::MakeReferenceBackend({}, &counts), path, c.spec);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->OpenSequence(1).ok());
    ASSERT_TRUE((*w)->OpenSequence(2).ok());
    counts = {};
    // Two sessions, 5 + 3 rows; logits for each chunk's last row.
    const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
    const std::vector<float> hidden(8 * shape.n_embd, 0.5f);
    ForwardInput in;
    in.chunks = {{1, 0, 5, true}, {2, 0, 3, true}};
    if (c.spec.has_embed) {
      in.tokens = ids;
    } else {
      in.hidden = hidden;
    }
    ForwardOutput out;
    ASSERT_TRUE((*w)->Forward(in, &out).ok());
    EXPECT_EQ(counts.uploaded, 8 * c.up_per_row);
    EXPECT_EQ(counts.downloaded, 8 * c.down_per_row + 2 * c.down_per_logit_row);
  }
}

TEST(BackendWindowTest, ATypeTheBackendCannotRunIsRefusedAtLoadNamingTensorTypeAndBackend) {
  testing::TempDir dir;
  const std::string path = TinyModel(dir, TensorType::kQ8_0);
  testing::ReferenceOptions o;
  o.refuse_types = {TensorType::kQ8_0};
  auto w = LoadOn(testing::MakeReferenceBackend(o), path, {1, 2, false, false});
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr(path + ": tensor blk.1.attn_q.weight has type "
                                                     "q8_0, which backend ref cannot run"));
}

TEST(BackendWindowTest, AnOpTheBackendLacksIsRefusedAtLoadNamingTheLayerAndTheOp) {
  testing::TempDir dir;
  const std::string path = TinyModel(dir, TensorType::kF32);
  testing::ReferenceOptions o;
  o.refuse_ops = {Op::kAttention};
  auto w = LoadOn(testing::MakeReferenceBackend(o), path, {1, 2, false, true});
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(),
              HasSubstr(path + ": layer 1 needs op attention, which backend ref does not run"));
  o.refuse_ops = {Op::kGetRows};
  w = LoadOn(testing::MakeReferenceBackend(o), path, {0, 1, true, false});
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("the token embeddings needs op get_rows"));
}

TEST(BackendWindowTest, ADeviceWithoutRoomForTheWeightsIsRefusedNamingTheSizes) {
  testing::TempDir dir;
  const std::string path = TinyModel(dir, TensorType::kF32);
  testing::ReferenceOptions o;
  o.memory_bytes = 40 << 10;  // the embeddings alone take 24 KiB, each layer ~100 KiB
  auto w = LoadOn(testing::MakeReferenceBackend(o), path, {0, 2, true, true});
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr(path + ": backend ref: cannot allocate"));
  EXPECT_THAT(w.status().message(), HasSubstr("free of 40.00 KiB"));
}

TEST(BackendWindowTest, ASequenceTheDeviceCannotHoldIsRefusedAndTheWindowServesOn) {
  testing::TempDir dir;
  const std::string path = TinyModel(dir, TensorType::kF32);
  auto sized = LoadOn(testing::MakeReferenceBackend(), path, {0, 2, true, true});
  ASSERT_TRUE(sized.ok()) << sized.status().message();
  // Room for the weights and a few rows, not for a 64-token prompt (~200 KiB of scratch and KV).
  testing::ReferenceOptions o;
  o.memory_bytes = (*sized)->device_weight_bytes() + (40 << 10);
  auto w = LoadOn(testing::MakeReferenceBackend(o), path, {0, 2, true, true});
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_TRUE((*w)->OpenSequence(1).ok());
  std::vector<int32_t> ids(kCtx, 3);
  ForwardInput in;
  in.chunks = {{1, 0, kCtx, true}};
  in.tokens = ids;
  ForwardOutput out;
  Status s = (*w)->Forward(in, &out);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("cannot allocate"));
  EXPECT_EQ((*w)->SequenceLength(1), 0);  // refused before any state changed
  in.chunks = {{1, 0, 2, true}};
  in.tokens = std::span<const int32_t>(ids.data(), 2);
  s = (*w)->Forward(in, &out);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ((*w)->SequenceLength(1), 2);
}

}  // namespace
}  // namespace kvasir
