// Stage slices: every split of a model into slices computes exactly what the full file computes,
// a ring of stages served from slices generates the full model's tokens, a slice keeps its
// parent's identity, and bad windows are refused with a clear message.
#include "shard/slice.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "model/model_id.h"
#include "ring/stage.h"
#include "ring_test_util.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::TempDir;

std::shared_ptr<const GgufFile> Open(const std::string& path) {
  auto f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return nullptr;
  return std::make_shared<const GgufFile>(std::move(f).value());
}

uint64_t TensorBytes(const GgufFile& f) {
  uint64_t n = 0;
  for (const auto& t : f.tensors()) n += t.n_bytes;
  return n;
}

// All ways to cut n layers into contiguous non-empty windows, as window sizes.
void Compositions(int n, std::vector<int>* prefix, std::vector<std::vector<int>>* out) {
  if (n == 0) {
    out->push_back(*prefix);
    return;
  }
  for (int k = 1; k <= n; ++k) {
    prefix->push_back(k);
    Compositions(n - k, prefix, out);
    prefix->pop_back();
  }
}

std::string SplitName(const std::vector<int>& sizes) {
  std::string s;
  for (int k : sizes) s += (s.empty() ? "" : ",") + std::to_string(k);
  return "{" + s + "}";
}

// Teacher-forced logits for every row of `tokens` through a chain of windows, hidden states handed
// on from one to the next.
std::vector<float> ChainLogits(const std::vector<std::unique_ptr<LayerWindow>>& chain,
                               const std::vector<int32_t>& tokens) {
  ForwardInput in;
  in.chunks = {{0, 0, static_cast<int>(tokens.size())}};
  in.tokens = tokens;
  in.all_logits = true;
  std::vector<float> hidden;
  ForwardOutput out;
  for (const auto& w : chain) {
    EXPECT_TRUE(w->OpenSequence(0).ok());
    Status st = w->Forward(in, &out);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) return {};
    hidden = std::move(out.hidden);
    in.hidden = hidden;
  }
  return out.logits;
}

std::vector<int32_t> Prompt(int n_vocab) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 12; ++i) ids.push_back((1 + 37 * i) % n_vocab);
  return ids;
}

struct SliceCase {
  std::string model;
  bool tied;
};

class SliceSplitTest : public ::testing::TestWithParam<SliceCase> {};

// Every split into slices gives bit-identical logits to the full file, and the slices together hold
// the parent's tensor bytes once (plus the embeddings again for a tied head not on layer 0).
TEST_P(SliceSplitTest, EverySplitMatchesFullModel) {
  const SliceCase c = GetParam();
  KV_REQUIRE_ASSET("models/" + c.model);
  auto full = Open(AssetPath("models/" + c.model));
  ASSERT_NE(full, nullptr);
  auto cfg = LoadModelConfig(*full);
  ASSERT_TRUE(cfg.ok());
  ASSERT_EQ(cfg->tied_output, c.tied);
  const int n_layer = cfg->n_layer;
  const std::vector<int32_t> prompt = Prompt(cfg->n_vocab);
  const uint64_t embd_bytes = full->FindTensor("token_embd.weight")->n_bytes;

  WindowOptions opt;
  opt.n_ctx = 64;
  std::vector<std::unique_ptr<LayerWindow>> whole;
  auto w = LayerWindow::Load(full, {0, n_layer, true, true}, opt);
  ASSERT_TRUE(w.ok()) << w.status().message();
  whole.push_back(std::move(w).value());
  const std::vector<float> want = ChainLogits(whole, prompt);
  ASSERT_EQ(want.size(), prompt.size() * cfg->n_vocab);

  std::vector<std::vector<int>> splits;
  std::vector<int> prefix;
  Compositions(n_layer, &prefix, &splits);
  for (const auto& sizes : splits) {
    SCOPED_TRACE(c.model + " split " + SplitName(sizes));
    TempDir dir;
    std::vector<std::unique_ptr<LayerWindow>> chain;
    uint64_t slice_bytes = 0;
    int first = 0;
    for (int k : sizes) {
      const int last = first + k;
      const std::string path = dir.File(fmt::format("stage-{}-{}.gguf", first, last));
      SliceSummary summary;
      Status st = WriteSlice(*full, first, last, path, &summary);
      ASSERT_TRUE(st.ok()) << st.message();
      auto slice = Open(path);
      ASSERT_NE(slice, nullptr);
      EXPECT_EQ(summary.bytes, TensorBytes(*slice));
      EXPECT_EQ(summary.n_tensors, static_cast<int>(slice->tensors().size()));
      EXPECT_EQ(summary.parent_bytes, TensorBytes(*full));
      if (sizes.size() > 1) {
        EXPECT_LT(slice->file_size(), full->file_size());
      }
      slice_bytes += summary.bytes;
      auto win = LayerWindow::Load(slice, {first, last, first == 0, last == n_layer}, opt);
      ASSERT_TRUE(win.ok()) << win.status().message();
      chain.push_back(std::move(win).value());
      first = last;
    }
    const bool dup_embd = c.tied && sizes.back() != n_layer;
    EXPECT_EQ(slice_bytes, TensorBytes(*full) + (dup_embd ? embd_bytes : 0));
    const std::vector<float> got = ChainLogits(chain, prompt);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
        << "logits differ";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, SliceSplitTest,
                         ::testing::Values(SliceCase{"stories260K.gguf", false},
                                           SliceCase{"synth-qwen2-q8_0.gguf", true},
                                           SliceCase{"synth-qwen35moe-f32.gguf", false}),
                         [](const auto& info) {
                           const std::string& m = info.param.model;
                           return m.find("qwen35moe") != std::string::npos ? std::string("qwen35moe")
                                  : info.param.tied                         ? std::string("qwen2")
                                                                            : std::string("stories");
                         });

// A slice carries its window, whether the parent's head is tied, and the parent's identity.
TEST(SliceTest, KeysAndIdentity) {
  KV_REQUIRE_ASSET("models/synth-qwen2-q8_0.gguf");
  auto full = Open(AssetPath("models/synth-qwen2-q8_0.gguf"));
  ASSERT_NE(full, nullptr);
  TempDir dir;
  const std::string path = dir.File("tail.gguf");
  ASSERT_TRUE(WriteSlice(*full, 1, 2, path, nullptr).ok());
  auto slice = Open(path);
  ASSERT_NE(slice, nullptr);
  EXPECT_EQ(*slice->GetUint("kvasir.window.first"), 1u);
  EXPECT_EQ(*slice->GetUint("kvasir.window.last"), 2u);
  EXPECT_EQ(*slice->GetBool("kvasir.window.tied_output"), true);
  // All of the parent's metadata is kept (the tokenizer included).
  for (const auto& kv : full->kvs()) EXPECT_NE(slice->Find(kv.key), nullptr) << kv.key;
  // The tied head rides along as token_embd.weight; no other layer is present.
  EXPECT_NE(slice->FindTensor("token_embd.weight"), nullptr);
  EXPECT_NE(slice->FindTensor("output_norm.weight"), nullptr);
  EXPECT_EQ(slice->FindTensor("output.weight"), nullptr);
  for (const auto& t : slice->tensors()) EXPECT_EQ(t.name.rfind("blk.0.", 0), std::string::npos);

  auto parent_id = ComputeModelId(full->header(), full->path());
  auto slice_id = ComputeModelId(slice->header(), slice->path());
  ASSERT_TRUE(parent_id.ok() && slice_id.ok());
  EXPECT_EQ(*slice_id, *parent_id);
  EXPECT_EQ(*slice->GetString("kvasir.model_id"), ModelIdHex(*parent_id));
}

// Slicing a slice inside its window gives the same tensors and identity as slicing the parent.
TEST(SliceTest, SliceOfSliceWithinWindow) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  auto full = Open(AssetPath("models/stories260K.gguf"));
  ASSERT_NE(full, nullptr);
  TempDir dir;
  ASSERT_TRUE(WriteSlice(*full, 1, 5, dir.File("a.gguf"), nullptr).ok());
  auto a = Open(dir.File("a.gguf"));
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(WriteSlice(*a, 2, 5, dir.File("b.gguf"), nullptr).ok());
  ASSERT_TRUE(WriteSlice(*full, 2, 5, dir.File("c.gguf"), nullptr).ok());
  auto b = Open(dir.File("b.gguf"));
  auto c = Open(dir.File("c.gguf"));
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(b->tensors().size(), c->tensors().size());
  for (size_t i = 0; i < b->tensors().size(); ++i) {
    EXPECT_EQ(b->tensors()[i].name, c->tensors()[i].name);
    auto bd = b->TensorData(b->tensors()[i]);
    auto cd = c->TensorData(c->tensors()[i]);
    ASSERT_EQ(bd.size(), cd.size());
    EXPECT_EQ(0, std::memcmp(bd.data(), cd.data(), bd.size())) << b->tensors()[i].name;
  }
  EXPECT_EQ(*ComputeModelId(b->header(), b->path()), *ComputeModelId(full->header(), full->path()));
  EXPECT_EQ(*b->GetBool("kvasir.window.tied_output"), false);
}

TEST(SliceTest, RefusesBadWindows) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  auto full = Open(AssetPath("models/stories260K.gguf"));
  ASSERT_NE(full, nullptr);
  TempDir dir;
  const std::string out = dir.File("s.gguf");

  Status past = WriteSlice(*full, 3, 6, out, nullptr);
  EXPECT_FALSE(past.ok());
  EXPECT_NE(past.message().find("layers 3:6 are not a window of the model's 5 layers"),
            std::string::npos)
      << past.message();
  Status empty = WriteSlice(*full, 2, 2, out, nullptr);
  EXPECT_FALSE(empty.ok());
  EXPECT_NE(empty.message().find("layers 2:2"), std::string::npos) << empty.message();
  Status no_dir = WriteSlice(*full, 0, 2, dir.File("missing/s.gguf"), nullptr);
  EXPECT_FALSE(no_dir.ok());
  EXPECT_NE(no_dir.message().find("does not exist"), std::string::npos) << no_dir.message();
  EXPECT_FALSE(std::filesystem::exists(out));

  // A slice holds only its window: slicing or loading layers outside it is refused.
  ASSERT_TRUE(WriteSlice(*full, 2, 5, out, nullptr).ok());
  auto slice = Open(out);
  ASSERT_NE(slice, nullptr);
  Status outside = WriteSlice(*slice, 1, 3, dir.File("t.gguf"), nullptr);
  EXPECT_FALSE(outside.ok());
  EXPECT_NE(outside.message().find("holds layers 2:5 (a stage slice); layers 1:3 are not in it"),
            std::string::npos)
      << outside.message();
  auto win = LayerWindow::Load(slice, {0, 2, true, false}, WindowOptions{});
  ASSERT_FALSE(win.ok());
  EXPECT_EQ(win.status().message(),
            out + ": holds layers 2:5 (a stage slice); layers 0:2 are not in it");
  // A narrower window inside the slice loads.
  EXPECT_TRUE(LayerWindow::Load(slice, {3, 5, false, true}, WindowOptions{}).ok());
}

// A ring of stages each served from its own slice generates the full model's greedy tokens: the
// slices keep the parent's identity, so the HELLO handshakes pass.
TEST(SliceTest, RingOfSlicesMatchesFullModel) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string model = AssetPath("models/stories260K.gguf");
  auto full = Open(model);
  ASSERT_NE(full, nullptr);
  TempDir dir;
  const int windows[3][2] = {{0, 1}, {1, 3}, {3, 5}};
  testing::BoundPorts ports(3);
  std::vector<std::unique_ptr<ring::Stage>> stages;
  for (int i = 0; i < 3; ++i) {
    const std::string path = dir.File(fmt::format("s{}.gguf", i));
    ASSERT_TRUE(WriteSlice(*full, windows[i][0], windows[i][1], path, nullptr).ok());
    ring::StageOptions o;
    o.model_path = path;
    o.first = windows[i][0];
    o.last = windows[i][1];
    o.listen_fd = ports.Take(i);
    o.next = fmt::format("127.0.0.1:{}", ports[(i + 1) % 3]);
    o.name = fmt::format("s{}", i);
    o.n_ctx = 256;
    o.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
    o.ring_secret = testing::kTestRingSecret;
    auto stage = ring::Stage::Create(o);
    ASSERT_TRUE(stage.ok()) << stage.status().message();
    stages.push_back(std::move(stage).value());
  }
  std::vector<std::thread> threads;
  for (auto& s : stages) threads.emplace_back([st = s.get()] { (void)st->Run(); });
  SamplingParams greedy;
  greedy.temperature = 0;
  const auto local = testing::GenerateLocally(model, "Once upon a time", greedy, 24);
  const auto got = testing::GenerateOnRing(fmt::format("127.0.0.1:{}", ports[0]),
                                           "Once upon a time", greedy, 24);
  for (auto& s : stages) s->Stop();
  for (auto& t : threads) t.join();
  EXPECT_FALSE(local.ids.empty());
  EXPECT_EQ(got.ids, local.ids);
  EXPECT_EQ(got.text, local.text);
}

// Runs a command line, returning its exit status and combined output.
int RunCommand(const std::string& cmd, std::string* output) {
  std::FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// `kvasir slice` writes the slice and says so; `kvasir inspect` shows its window; bad input gets
// one line and a non-zero exit.
TEST(SliceCliTest, SliceThenInspect) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string model = AssetPath("models/stories260K.gguf");
  TempDir dir;
  const std::string out = dir.File("stage.gguf");
  std::string log;
  ASSERT_EQ(
      0,
      RunCommand(fmt::format("{} slice -m {} --layers 2:5 -o {}", KVASIR_BINARY, model, out), &log))
      << log;
  EXPECT_NE(log.find("slice: wrote " + out + ": layers 2:5, "), std::string::npos) << log;
  EXPECT_NE(log.find(" MiB of the parent's "), std::string::npos) << log;

  std::string shown;
  ASSERT_EQ(0, RunCommand(fmt::format("{} inspect {}", KVASIR_BINARY, out), &shown)) << shown;
  EXPECT_NE(shown.find("layers [2, 5)"), std::string::npos) << shown;
  EXPECT_NE(shown.find("kvasir.window.tied_output"), std::string::npos) << shown;

  for (const std::string& args :
       {fmt::format("-m {} --layers 4:9 -o {}", model, dir.File("x.gguf")),
        fmt::format("-m {} --layers 0:2 -o {}", out, dir.File("x.gguf")),
        fmt::format("-m {} --layers 0:2 -o {}", model, dir.File("no/such/dir/x.gguf"))}) {
    std::string err;
    EXPECT_NE(0, RunCommand(fmt::format("{} slice {}", KVASIR_BINARY, args), &err)) << args;
    EXPECT_NE(err.find("kvasir slice: "), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), err.size() - 1) << "one line expected: " << err;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.File("x.gguf")));
}

}  // namespace
}  // namespace kvasir
