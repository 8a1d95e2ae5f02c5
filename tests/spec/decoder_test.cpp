// Speculative decoding of one sequence (spec::Decoder) on the shared models: greedy output with
// every drafter equals plain decoding token for token, rejected rows leave no trace, and with
// temperature the tokens at each step follow the same distribution as without speculation.
#include "spec/decoder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "model/arch/registry.h"
#include "spec/model_drafter.h"
#include "spec/ngram_drafter.h"
#include "spec/chi_square.h"
#include "test_assets.h"

namespace kvasir::spec {
namespace {

using testing::AssetPath;

std::unique_ptr<LayerWindow> LoadWhole(const std::string& rel, int max_checkpoints = 8) {
  auto file = GgufFile::Open(AssetPath(rel));
  EXPECT_TRUE(file.ok()) << file.status().message();
  if (!file.ok()) return nullptr;
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  auto cfg = LoadModelConfig(*shared);
  EXPECT_TRUE(cfg.ok()) << cfg.status().message();
  if (!cfg.ok()) return nullptr;
  WindowOptions opt;
  opt.n_ctx = 256;
  opt.n_threads = 2;
  opt.max_checkpoints = max_checkpoints;
  auto w = LayerWindow::Load(shared, {0, cfg->n_layer, true, true}, opt);
  EXPECT_TRUE(w.ok()) << w.status().message();
  return w.ok() ? std::move(w).value() : nullptr;
}

std::unique_ptr<ModelDrafter> LoadDrafter(const std::string& rel, int n_vocab, int k) {
  auto d = ModelDrafter::Load(AssetPath(rel), n_vocab, k, 2, "cpu");
  EXPECT_TRUE(d.ok()) << d.status().message();
  return d.ok() ? std::move(d).value() : nullptr;
}

// Proposes K tokens that are almost never right: every step is a rejection.
class WrongDrafter final : public Drafter {
 public:
  explicit WrongDrafter(int n_vocab) : n_vocab_(n_vocab) {}
  const char* name() const override { return "wrong"; }
  Result<std::vector<int32_t>> Propose(std::span<const int32_t> history, int k) override {
    std::vector<int32_t> d;
    for (int i = 0; i < k; ++i) d.push_back((history.back() * 7 + 13 * i + 3) % n_vocab_);
    return d;
  }

 private:
  int n_vocab_;
};

// A prompt of token ids: some repetition, so that prompt lookup finds matches.
std::vector<int32_t> Prompt(int n_vocab) {
  std::vector<int32_t> p = {1};
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 5; ++i) p.push_back((40 + 17 * i) % n_vocab);
  }
  return p;
}

// n tokens decoded from `prompt` (fewer only if the decoder fails).
std::vector<int32_t> Decode(LayerWindow& w, const SamplingParams& params, Drafter* drafter, int k,
                            const std::vector<int32_t>& prompt, int n, DraftStats* stats = nullptr,
                            int seq = 0, bool adapt_k = true) {
  Sampler sampler(params);
  Decoder dec(w, seq, sampler, drafter, k, adapt_k);
  const Status st = dec.Start(prompt);
  EXPECT_TRUE(st.ok()) << st.message();
  std::vector<int32_t> out;
  while (st.ok() && static_cast<int>(out.size()) < n) {
    auto got = dec.Step(n - static_cast<int>(out.size()));
    EXPECT_TRUE(got.ok()) << got.status().message();
    if (!got.ok()) break;
    EXPECT_LE(got->size(), static_cast<size_t>(std::max(1, n - static_cast<int>(out.size()))));
    out.insert(out.end(), got->begin(), got->end());
  }
  if (stats != nullptr) *stats = dec.stats();
  return out;
}

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

struct Case {
  const char* model;
  const char* draft_model;  // a GGUF sharing the vocabulary
};

class GreedyTest : public ::testing::TestWithParam<Case> {};

TEST_P(GreedyTest, EveryDrafterGivesThePlainOutput) {
  const Case c = GetParam();
  KV_REQUIRE_ASSET(c.model);
  KV_REQUIRE_ASSET(c.draft_model);
  auto w = LoadWhole(c.model);
  ASSERT_NE(w, nullptr);
  const int n_vocab = w->config().n_vocab;
  // The prompt, what the model says after it, and the prompt again: prompt lookup then finds the
  // tail in the middle and has something to draft from the first step on.
  std::vector<int32_t> prompt = Prompt(n_vocab);
  const std::vector<int32_t> said = Decode(*w, Greedy(), nullptr, 0, prompt, 16);
  const std::vector<int32_t> head = prompt;
  prompt.insert(prompt.end(), said.begin(), said.end());
  prompt.insert(prompt.end(), head.begin(), head.end());
  constexpr int kTokens = 32;
  const std::vector<int32_t> plain = Decode(*w, Greedy(), nullptr, 0, prompt, kTokens);
  ASSERT_EQ(plain.size(), static_cast<size_t>(kTokens));

  NgramDrafter ngram;
  DraftStats ngram_stats;
  EXPECT_EQ(Decode(*w, Greedy(), &ngram, 4, prompt, kTokens, &ngram_stats), plain);
  EXPECT_GT(ngram_stats.drafted, 0);

  auto self = LoadDrafter(c.model, n_vocab, 4);
  ASSERT_NE(self, nullptr);
  DraftStats self_stats;
  EXPECT_EQ(Decode(*w, Greedy(), self.get(), 4, prompt, kTokens, &self_stats), plain);
  // The model drafting for itself is always right.
  EXPECT_GT(self_stats.drafted, 0);
  EXPECT_EQ(self_stats.accepted, self_stats.drafted);

  auto other = LoadDrafter(c.draft_model, n_vocab, 3);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(Decode(*w, Greedy(), other.get(), 3, prompt, kTokens), plain);

  // Many rejections (K kept at 4): the window rolls back every step and still decodes what a
  // fresh run does. With K adapted, drafting pauses and few steps draft at all.
  WrongDrafter wrong(n_vocab);
  DraftStats wrong_stats;
  EXPECT_EQ(Decode(*w, Greedy(), &wrong, 4, prompt, kTokens, &wrong_stats, 0, false), plain);
  EXPECT_GT(wrong_stats.drafted, wrong_stats.accepted + kTokens);
  EXPECT_EQ(Decode(*w, Greedy(), &wrong, 4, prompt, kTokens, &wrong_stats), plain);
  EXPECT_LT(wrong_stats.steps, kTokens / 2);
  EXPECT_EQ(Decode(*w, Greedy(), nullptr, 0, prompt, kTokens, nullptr, /*seq=*/5), plain);
}

INSTANTIATE_TEST_SUITE_P(
    Models, GreedyTest,
    ::testing::Values(Case{"models/stories260K.gguf", "models/stories260K-q8_0.gguf"},
                      Case{"models/synth-llama-q4_k_m.gguf", "models/stories260K.gguf"},
                      Case{"models/synth-qwen35moe-f32.gguf", "models/stories260K.gguf"}),
    [](const auto& info) {
      std::string name = info.param.model;
      name = name.substr(name.find('/') + 1);
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

// Two sessions' drafters on one draft window, called in turn, draft what each would alone.
TEST(ModelDrafterTest, DraftersSharingAWindowKeepTheirSequencesApart) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  std::shared_ptr<LayerWindow> shared = LoadWhole("models/stories260K.gguf");
  ASSERT_NE(shared, nullptr);
  ModelDrafter a(shared, 1), b(shared, 2);
  const std::vector<int32_t> ha = {1, 403, 407, 261, 378}, hb = {1, 300, 301, 40};
  auto alone_a = a.Propose(ha, 4);
  auto alone_b = b.Propose(hb, 4);
  ASSERT_TRUE(alone_a.ok() && alone_b.ok());
  ASSERT_EQ(alone_a->size(), 4u);
  // Both histories grow by one accepted draft and one other token, interleaved.
  std::vector<int32_t> ha2 = ha, hb2 = hb;
  ha2.insert(ha2.end(), {(*alone_a)[0], 7});
  hb2.insert(hb2.end(), {(*alone_b)[0], 9});
  auto next_a = a.Propose(ha2, 3);
  auto next_b = b.Propose(hb2, 3);
  ASSERT_TRUE(next_a.ok() && next_b.ok());
  ModelDrafter fresh_a(LoadWhole("models/stories260K.gguf"), 0);
  ModelDrafter fresh_b(LoadWhole("models/stories260K.gguf"), 0);
  EXPECT_EQ(*next_a, *fresh_a.Propose(ha2, 3));
  EXPECT_EQ(*next_b, *fresh_b.Propose(hb2, 3));
}

TEST(DrafterLoadTest, AnotherVocabularyIsRefused) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  auto d = ModelDrafter::Load(AssetPath("models/stories260K.gguf"), 32000, 4, 1, "cpu");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("vocabulary of 512 tokens, but the model's has 32000"),
            std::string::npos)
      << d.status().message();
}

// With temperature, speculation is lossless: over many seeds the token at each step has the same
// distribution with a draft model (accepting some drafts, rejecting others) as without.
TEST(TemperatureTest, EachStepFollowsThePlainDistribution) {
  constexpr char kModel[] = "models/stories260K.gguf";
  KV_REQUIRE_ASSET(kModel);
  auto w = LoadWhole(kModel);
  ASSERT_NE(w, nullptr);
  auto drafter = LoadDrafter("models/stories260K-q8_0.gguf", w->config().n_vocab, 3);
  ASSERT_NE(drafter, nullptr);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};  // "Once upon a time"
  constexpr int kRuns = 1500, kSteps = 6;
  StepHistograms histograms(kSteps);
  DraftStats total;
  for (int r = 0; r < kRuns; ++r) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 20;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 1000 + r;
    const auto a = Decode(*w, p, nullptr, 0, prompt, kSteps);
    p.seed = 900000 + r;
    DraftStats st;
    const auto b = Decode(*w, p, drafter.get(), 3, prompt, kSteps, &st);
    ASSERT_EQ(a.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(b.size(), static_cast<size_t>(kSteps));
    histograms.Add(a, b);
    total.drafted += st.drafted;
    total.accepted += st.accepted;
  }
  // Both paths of the rule ran many times.
  EXPECT_GT(total.accepted, kRuns);
  EXPECT_GT(total.drafted - total.accepted, kRuns / 5);
  histograms.ExpectSameDistributions(kRuns);
}

}  // namespace
}  // namespace kvasir::spec
