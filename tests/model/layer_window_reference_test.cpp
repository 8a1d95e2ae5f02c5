// The whole model against the shared references: teacher-forced logits against the exact float64
// forward pass (bounded by llama.cpp's own error), and greedy generation against llama.cpp's ids.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/gguf_writer.h"
#include "model/layer_window.h"
#include "model/sampler.h"
#include "test_assets.h"
#include "tiny_model.h"

namespace kvasir {
namespace {

using testing::AssetPath;

struct RefCase {
  nlohmann::json meta;
  std::vector<int32_t> prompt_ids, generated_ids;
  std::vector<float> exact;  // [n_steps, n_vocab]
};

RefCase LoadCase(const std::string& stem) {
  RefCase c;
  std::ifstream in(AssetPath("reference/" + stem + ".json"));
  c.meta = nlohmann::json::parse(in);
  c.prompt_ids = c.meta["prompt_ids"].get<std::vector<int32_t>>();
  c.generated_ids = c.meta["generated_ids"].get<std::vector<int32_t>>();
  const std::string raw =
      testing::ReadFileToString(AssetPath("reference/" + c.meta["exact_f64_logits_file"].get<std::string>()));
  c.exact.resize(raw.size() / 4);
  std::memcpy(c.exact.data(), raw.data(), c.exact.size() * 4);
  return c;
}

std::unique_ptr<LayerWindow> LoadFull(const std::string& model, int n_threads = 2) {
  auto file = GgufFile::Open(AssetPath("models/" + model));
  EXPECT_TRUE(file.ok()) << file.status().message();
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  const int n_layer = static_cast<int>(*shared->GetUint(*shared->GetString("general.architecture") +
                                                        ".block_count"));
  WindowOptions opt;
  opt.n_ctx = 256;
  opt.n_threads = n_threads;
  auto w = LayerWindow::Load(shared, {0, n_layer, true, true}, opt);
  EXPECT_TRUE(w.ok()) << w.status().message();
  return w.ok() ? std::move(w).value() : nullptr;
}

class ReferenceTest : public ::testing::TestWithParam<std::string> {};

// Teacher forcing along llama.cpp's greedy path: our logits must be at least as close to the exact
// float64 logits as llama.cpp's are, within a factor of 2.
TEST_P(ReferenceTest, LogitsMatchExactWithinLlamaCppError) {
  const std::string stem = GetParam();
  KV_REQUIRE_ASSET("reference/" + stem + ".json");
  RefCase c = LoadCase(stem);
  auto w = LoadFull(c.meta["model"].get<std::string>());
  ASSERT_NE(w, nullptr);
  std::vector<int32_t> ids = c.prompt_ids;
  ids.insert(ids.end(), c.generated_ids.begin(), c.generated_ids.end() - 1);
  ASSERT_TRUE(w->OpenSequence(0).ok());
  ForwardInput in;
  in.chunks = {{0, 0, static_cast<int>(ids.size())}};
  in.tokens = ids;
  in.all_logits = true;
  ForwardOutput out;
  ASSERT_TRUE(w->Forward(in, &out).ok());
  const int n_vocab = c.meta["n_vocab"].get<int>();
  const size_t n_steps = c.generated_ids.size();
  ASSERT_EQ(out.logits.size(), ids.size() * n_vocab);
  ASSERT_EQ(c.exact.size(), n_steps * n_vocab);
  double max_abs = 0;
  for (size_t s = 0; s < n_steps; ++s) {
    const float* ours = out.logits.data() + (c.prompt_ids.size() - 1 + s) * n_vocab;
    for (int v = 0; v < n_vocab; ++v) {
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(ours[v]) - c.exact[s * n_vocab + v]));
    }
  }
  const double llama_err = c.meta["llama_cpp_vs_f64_max_abs"].get<double>();
  RecordProperty("max_abs_vs_exact", std::to_string(max_abs));
  std::printf("%s: max |ours - exact| = %.3g, llama.cpp's = %.3g\n", stem.c_str(), max_abs,
              llama_err);
  EXPECT_LE(max_abs, 2 * llama_err) << stem;
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceTest,
                         ::testing::Values("stories260K.p1", "stories260K.p2",
                                           "stories260K-q8_0.p1", "stories260K-q8_0.p2",
                                           "stories260K-q4_0.p1", "stories260K-q4_0.p2",
                                           "llama-2-tiny-random.p1", "llama-2-tiny-random.p2",
                                           "synth-qwen2-q8_0.p1", "synth-qwen2-q8_0.p2",
                                           "synth-llama-q4_k_m.p1", "synth-llama-q4_k_m.p2",
                                           "synth-qwen3-q4_0.p1", "synth-qwen3-q4_0.p2"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return s;
                         });

// Greedy decoding token by token (prefill, then one token per step) reproduces llama.cpp's ids on
// the models whose top-1 margins are far above the numeric error.
class GreedyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GreedyTest, GreedyIdsMatchReference) {
  const std::string stem = GetParam();
  KV_REQUIRE_ASSET("reference/" + stem + ".json");
  RefCase c = LoadCase(stem);
  auto w = LoadFull(c.meta["model"].get<std::string>());
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->OpenSequence(7).ok());
  ForwardInput in;
  in.chunks = {{7, 0, static_cast<int>(c.prompt_ids.size())}};
  in.tokens = c.prompt_ids;
  ForwardOutput out;
  std::vector<int32_t> got;
  for (size_t step = 0; step < c.generated_ids.size(); ++step) {
    ASSERT_TRUE(w->Forward(in, &out).ok());
    const int32_t next = ArgMax(out.logits);
    got.push_back(next);
    in.chunks = {{7, w->SequenceLength(7), 1}};
    in.tokens = std::span<const int32_t>(&got.back(), 1);
  }
  EXPECT_EQ(got, c.generated_ids);
}

INSTANTIATE_TEST_SUITE_P(Models, GreedyTest,
                         ::testing::Values("stories260K.p1", "stories260K.p2",
                                           "stories260K-q8_0.p1", "stories260K-q8_0.p2"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return s;
                         });

// A tensor type the kernels cannot compute (iq2_xxs here) is refused at load with the tensor's
// type and the file named.
TEST(ReferenceErrors, UnsupportedTensorTypeIsNamed) {
  testing::TempDir dir;
  const std::string f32_path = dir.File("tiny-f32.gguf");
  testing::TinyModelShape shape;
  shape.n_embd = 256;  // a whole iq2_xxs block per row
  shape.n_ff = 256;
  ASSERT_TRUE(testing::WriteTinyModel(f32_path, shape).ok());
  auto f32 = GgufFile::Open(f32_path);
  ASSERT_TRUE(f32.ok()) << f32.status().message();
  // The same model with blk.0.ffn_up.weight as iq2_xxs (bytes are never read).
  GgufWriter w;
  w.CopyKvs(f32->header());
  for (const GgufTensorInfo& t : f32->tensors()) {
    const std::span<const uint64_t> ne(t.ne.data(), t.n_dims);
    if (t.name == "blk.0.ffn_up.weight") {
      const auto info = GetTensorTypeInfo(static_cast<uint32_t>(TensorType::kIQ2_XXS));
      ASSERT_TRUE(info.has_value());
      std::vector<uint8_t> bytes(t.n_elements() / info->block_elems * info->block_bytes);
      ASSERT_TRUE(w.AddTensor(t.name, TensorType::kIQ2_XXS, ne, bytes).ok());
    } else {
      ASSERT_TRUE(w.AddTensor(t.name, static_cast<TensorType>(t.type), ne, f32->TensorData(t)).ok());
    }
  }
  const std::string path = dir.File("tiny-iq2_xxs.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  auto window = LayerWindow::Load(shared, {0, shape.n_layer, true, true}, {});
  ASSERT_FALSE(window.ok());
  const std::string msg = window.status().message();
  EXPECT_NE(msg.find("iq2_xxs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("blk.0.ffn_up.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tiny-iq2_xxs.gguf"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kvasir
