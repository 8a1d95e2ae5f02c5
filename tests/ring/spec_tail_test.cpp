// The last stage's verify step alone (ring/spec_tail.h), on logits the test writes: which tokens a
// verify chunk decides, what the head is told to feed, and what is refused.
#include "ring/spec_tail.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "gguf/gguf_file.h"
#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "ring/batch_drafter.h"
#include "ring/sampling_wire.h"
#include "spec/model_drafter.h"
#include "tail_test_util.h"
#include "test_assets.h"

namespace kvasir::ring {
namespace {

constexpr int kVocab = 16;

// Rows of logits whose argmax is `argmax[i]`.
std::vector<float> Rows(const std::vector<int32_t>& argmax) {
  return testing::ArgmaxRows(argmax, kVocab);
}

class SpecTailTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KV_REQUIRE_ASSET("models/stories260K.gguf");
    auto w = testing::LoadWholeModel(testing::AssetPath("models/stories260K.gguf"));
    ASSERT_TRUE(w.ok()) << w.status().message();
    window_ = std::move(w).value();
    spec::DraftOptions o;
    o.kind = spec::DraftKind::kNgram;
    o.max_tokens = 4;
    auto t = SpecTail::Create(o, *window_);
    ASSERT_TRUE(t.ok() && *t != nullptr);
    spec_ = std::move(t).value();
  }

  std::unique_ptr<TailSampler> Sampler(uint32_t max_tokens) {
    SamplingParams greedy;
    greedy.temperature = 0;
    sampling_ = SamplingToWire(greedy, max_tokens, true);
    auto s = TailSampler::Create(sampling_, {1, 2, 3}, 256, kVocab);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return std::move(s).value();
  }

  static bool NoEog(int32_t) { return false; }

  std::unique_ptr<LayerWindow> window_;
  std::unique_ptr<SpecTail> spec_;
  wire::SamplingWire sampling_{};
};

TEST_F(SpecTailTest, AcceptsTheAgreeingPrefixThenTheSamplersOwnToken) {
  auto sampler = Sampler(100);
  auto d = spec_->NewSession(7, false);
  ASSERT_NE(d, nullptr);
  d->pending = {5, 6, 7};
  d->pending_pos = 10;
  // Rows: after the token at 10 (argmax 5: draft 5 accepted), after 5 (6: accepted), after 6
  // (9: draft 7 rejected, 9 instead), after 7 (unused).
  auto got = spec_->Verify(7, *sampler, *d, 10, 4, Rows({5, 6, 9, 3}), kVocab, 256, NoEog);
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ((*got)[0].token.id, 5);
  EXPECT_EQ((*got)[0].token.pos, 11u);
  EXPECT_TRUE((*got)[0].more);
  EXPECT_EQ((*got)[1].token.id, 6);
  EXPECT_TRUE((*got)[1].more);
  EXPECT_EQ((*got)[2].token.id, 9);
  EXPECT_EQ((*got)[2].token.pos, 13u);
  EXPECT_FALSE((*got)[2].more) << "the last decided token is the one the head feeds";
  EXPECT_TRUE(d->pending.empty());
  EXPECT_EQ(spec_->counts().drafted, 3u);
  EXPECT_EQ(spec_->counts().accepted, 2u);
}

TEST_F(SpecTailTest, EveryDraftAcceptedGivesOneTokenMore) {
  auto sampler = Sampler(100);
  auto d = spec_->NewSession(7, false);
  d->pending = {5, 6};
  d->pending_pos = 3;
  auto got = spec_->Verify(7, *sampler, *d, 3, 3, Rows({5, 6, 11}), kVocab, 256, NoEog);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ(got->back().token.id, 11);
  EXPECT_EQ(got->back().token.pos, 6u);
}

TEST_F(SpecTailTest, ATokenThatEndsTheSessionEndsTheVerify) {
  auto sampler = Sampler(2);  // max_tokens 2: the second decided token is the last
  auto d = spec_->NewSession(7, false);
  d->pending = {5, 6, 7};
  d->pending_pos = 3;
  auto got = spec_->Verify(7, *sampler, *d, 3, 4, Rows({5, 6, 7, 8}), kVocab, 256, NoEog);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ(got->back().token.finished, 1);
  EXPECT_FALSE(got->back().more);
  TokenMsg last = got->back();
  spec_->Draft(*sampler, *d, sampling_, 256, &last);
  EXPECT_TRUE(last.drafts.empty()) << "no drafts past max_tokens";
}

TEST_F(SpecTailTest, AChunkThatWasNotDraftedIsRefused) {
  auto sampler = Sampler(100);
  auto d = spec_->NewSession(7, false);
  d->pending = {5, 6};
  d->pending_pos = 3;
  EXPECT_FALSE(spec_->Verify(7, *sampler, *d, 4, 3, Rows({5, 6, 1}), kVocab, 256, NoEog).ok())
      << "another position";
  EXPECT_FALSE(spec_->Verify(7, *sampler, *d, 3, 4, Rows({5, 6, 1, 1}), kVocab, 256, NoEog).ok())
      << "another length";
}

TEST_F(SpecTailTest, PromptLookupDraftsWhatFollowedEarlier) {
  auto sampler = Sampler(100);  // history 1 2 3
  auto d = spec_->NewSession(7, false);
  // Decide 1 and 2 after the prompt: "1 2" occurred before, followed by 3.
  for (int32_t id : {1, 2}) {
    auto t = sampler->Sample(7, Rows({id}), 3, 256, NoEog);
    ASSERT_TRUE(t.ok());
  }
  TokenMsg last;
  last.token.pos = 4;
  spec_->Draft(*sampler, *d, sampling_, 256, &last);
  ASSERT_FALSE(last.drafts.empty());
  EXPECT_EQ(last.drafts[0], 3);
  EXPECT_EQ(d->pending, last.drafts);
  EXPECT_EQ(d->pending_pos, 4);
  EXPECT_EQ(spec_->NewSession(8, true), nullptr) << "a session with a grammar does not draft";
}

// Sessions drafting together get exactly the drafts a draft model gives each of them alone, also
// after their histories diverge from what was drafted (rows rolled back).
TEST(BatchDrafterTest, BatchedDraftsAreEachSessionsOwn) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string path = testing::AssetPath("models/stories260K.gguf");
  auto load = [&]() -> std::shared_ptr<LayerWindow> {
    auto file = GgufFile::Open(path);
    EXPECT_TRUE(file.ok());
    auto shared = std::make_shared<const GgufFile>(std::move(file).value());
    auto cfg = LoadModelConfig(*shared);
    WindowOptions o;
    o.n_ctx = 128;
    o.max_checkpoints = 10;
    auto w = LayerWindow::Load(shared, {0, cfg->n_layer, true, true}, o);
    EXPECT_TRUE(w.ok()) << w.status().message();
    return std::move(w).value();
  };
  BatchDrafter batch(load());
  const std::vector<std::vector<int32_t>> histories = {
      {1, 400, 30, 200}, {1, 9, 9, 9, 9, 9}, {1, 365, 2}};
  auto alone = [&](const std::vector<int32_t>& h, int k) {
    spec::ModelDrafter d(load(), 0);
    auto r = d.Propose(h, k);
    EXPECT_TRUE(r.ok());
    return *r;
  };
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<int32_t>> hs = histories;
    if (round == 1) {
      // Each history goes on: the first with its drafts' first token, the others elsewhere.
      hs[0].push_back(alone(histories[0], 4)[0]);
      hs[1].push_back(77);
      hs[2].push_back(5);
    }
    std::vector<BatchDrafter::Job> jobs(hs.size());
    std::vector<BatchDrafter::Job*> ptrs;
    for (size_t i = 0; i < hs.size(); ++i) {
      jobs[i] = {static_cast<int>(i) + 1, hs[i], 4 - static_cast<int>(i), {}};
      ptrs.push_back(&jobs[i]);
    }
    ASSERT_TRUE(batch.Propose(ptrs).ok());
    for (size_t i = 0; i < hs.size(); ++i) {
      EXPECT_EQ(jobs[i].drafts, alone(hs[i], 4 - static_cast<int>(i)))
          << "round " << round << ", session " << i;
    }
  }
  batch.Close(1);
  batch.Close(2);
  batch.Close(3);
}

}  // namespace
}  // namespace kvasir::ring
