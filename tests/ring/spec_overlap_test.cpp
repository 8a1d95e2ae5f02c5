// Overlap alone (docs/PROTOCOL.md, "Speculation"): several verify windows of a session in flight.
// The rollback span over verify chunks run back to back, the guessed window's TOKEN on the wire,
// and the last stage's bookkeeping: a window whose guess held continues without a new draft, the
// windows behind a miss decide nothing, and guesses follow the drafter over the guessed history.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "gguf/gguf_file.h"
#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "ring/frame.h"
#include "ring/messages.h"
#include "ring/sampling_wire.h"
#include "ring/spec_tail.h"
#include "ring/verify_rows.h"
#include "tail_test_util.h"
#include "test_assets.h"

namespace kvasir::ring {
namespace {

using testing::RoundTrip;

TEST(ExtendVerifySpan, ChunksBackToBackMakeOneSpan) {
  VerifySpan span = ExtendVerifySpan({}, 5, 5, 16);
  EXPECT_EQ(span.pos0, 5);
  EXPECT_EQ(span.n_rows, 5);
  span = ExtendVerifySpan(span, 10, 5, 16);
  EXPECT_EQ(span.pos0, 5);
  EXPECT_EQ(span.n_rows, 10);
  // The next chunk may keep any length after the first row of the first chunk.
  for (int pos0 = 6; pos0 <= 15; ++pos0) EXPECT_EQ(*KeepBeforeChunk(span, 15, pos0), pos0);
  EXPECT_FALSE(KeepBeforeChunk(span, 15, 5).ok()) << "the first chunk's token was decided";
}

TEST(ExtendVerifySpan, AChunkElsewhereStartsAnewAndTheSpanIsBounded) {
  EXPECT_EQ(ExtendVerifySpan({5, 5}, 7, 3, 16).pos0, 7) << "after a rollback to 7";
  EXPECT_EQ(ExtendVerifySpan({5, 5}, 7, 3, 16).n_rows, 3);
  VerifySpan span{};
  for (int pos0 = 0; pos0 < 50; pos0 += 5) span = ExtendVerifySpan(span, pos0, 5, 16);
  // 50 rows ran; a window keeps 16 rows of rollback, so only lengths from 34 on may be kept.
  EXPECT_EQ(span.pos0 + span.n_rows, 50);
  EXPECT_EQ(span.n_rows, 17);
  EXPECT_EQ(*KeepBeforeChunk(span, 50, 34), 34);
  EXPECT_FALSE(KeepBeforeChunk(span, 50, 33).ok());
}

TEST(OverlapWire, AGuessedWindowIsATokenWithItsDraftsAndTheAheadFlag) {
  TokenMsg t;
  t.token.session = 3;
  t.token.pos = 17;
  t.token.id = 42;
  t.drafts = {7, 8};
  t.ahead = true;
  auto back = RoundTrip(t);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(std::get<TokenMsg>(*back).ahead);
  EXPECT_EQ(std::get<TokenMsg>(*back).drafts, t.drafts);
  TokenMsg plain = t;
  plain.ahead = false;
  back = RoundTrip(plain);
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(std::get<TokenMsg>(*back).ahead);

  TokenMsg bare = t;
  bare.drafts.clear();
  EXPECT_FALSE(CheckEncodable(bare).ok()) << "a guess without drafts";
  TokenMsg more = t;
  more.drafts.clear();
  more.more = true;
  EXPECT_FALSE(CheckEncodable(more).ok());
  // On the wire too: the flag without drafts is refused.
  TokenMsg no_drafts = t;
  no_drafts.drafts.clear();
  no_drafts.ahead = false;
  std::vector<uint8_t> bytes = EncodeMessage(no_drafts);
  const size_t flags_at = sizeof(wire::FrameHeader) + offsetof(wire::TokenBody, flags);
  bytes[flags_at] |= wire::kTokenAhead;
  FrameDecoder decoder;
  decoder.Feed(bytes);
  auto frame = decoder.Next();
  ASSERT_TRUE(frame.ok() && frame->has_value());
  EXPECT_FALSE(DecodeMessage(**frame).ok());
  // A guess with a cached count, which no stage encodes (found by frame_decoder_fuzz), is refused
  // on the wire as CheckEncodable refuses it.
  TokenMsg cached = t;
  cached.ahead = false;
  cached.n_cached = 3;
  ASSERT_TRUE(CheckEncodable(cached).ok());
  bytes = EncodeMessage(cached);
  bytes[flags_at] |= wire::kTokenAhead;
  FrameDecoder again;
  again.Feed(bytes);
  frame = again.Next();
  ASSERT_TRUE(frame.ok() && frame->has_value());
  auto refused = DecodeMessage(**frame);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("cached"), std::string::npos);
}

constexpr int kVocab = 16;

std::vector<float> Rows(const std::vector<int32_t>& argmax) {
  return testing::ArgmaxRows(argmax, kVocab);
}

bool NoEog(int32_t) { return false; }

class OverlapTailTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KV_REQUIRE_ASSET("models/stories260K.gguf");
    auto w = testing::LoadWholeModel(testing::AssetPath("models/stories260K.gguf"));
    ASSERT_TRUE(w.ok()) << w.status().message();
    window_ = std::move(w).value();
    spec_ = Spec(3, 0.0);
  }

  std::unique_ptr<SpecTail> Spec(int windows, double min_acceptance) {
    spec::DraftOptions o;
    o.kind = spec::DraftKind::kNgram;
    o.max_tokens = 2;
    o.windows = windows;
    o.overlap_min_acceptance = min_acceptance;
    auto t = SpecTail::Create(o, *window_);
    EXPECT_TRUE(t.ok() && *t != nullptr);
    return t.ok() ? std::move(t).value() : nullptr;
  }

  std::unique_ptr<TailSampler> Sampler(std::vector<int32_t> prompt) {
    SamplingParams greedy;
    greedy.temperature = 0;
    sampling_ = SamplingToWire(greedy, 100, true);
    auto s = TailSampler::Create(sampling_, std::move(prompt), 256, kVocab);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return std::move(s).value();
  }

  std::unique_ptr<LayerWindow> window_;
  std::unique_ptr<SpecTail> spec_;
  wire::SamplingWire sampling_{};
};

TEST_F(OverlapTailTest, AWindowWhoseGuessHeldContinuesWithoutNewDrafts) {
  auto sampler = Sampler({1, 2, 3});
  auto d = spec_->NewSession(7, false);
  d->pending = {5, 6};
  d->pending_pos = 2;
  d->further.push_back({5, {7, 8}});  // guessed: 5 and 6 accepted, then 7
  auto got = spec_->Verify(7, *sampler, *d, 2, 3, Rows({5, 6, 7}), kVocab, 256, NoEog);
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ(got->back().token.id, 7);
  EXPECT_EQ(got->back().token.pos, 5u);
  EXPECT_TRUE(got->back().more) << "7 is in the ring already, as the next window's first row";
  EXPECT_TRUE(got->back().drafts.empty());
  EXPECT_EQ(d->pending, (std::vector<int32_t>{8}));
  EXPECT_EQ(d->pending_pos, 5);
  EXPECT_TRUE(d->further.empty());
  EXPECT_EQ(spec_->counts().confirmed, 1u);
  // The next window's rows decide as any verify chunk.
  got = spec_->Verify(7, *sampler, *d, 5, 2, Rows({8, 9}), kVocab, 256, NoEog);
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ(got->back().token.id, 9);
  EXPECT_FALSE(got->back().more);
  EXPECT_EQ(sampler->history(), (std::vector<int32_t>{1, 2, 3, 5, 6, 7, 8, 9}));
}

TEST_F(OverlapTailTest, WindowsBehindAMissDecideNothing) {
  for (bool bonus_differs : {false, true}) {
    auto sampler = Sampler({1, 2, 3});
    auto d = spec_->NewSession(7, false);
    d->pending = {5, 6};
    d->pending_pos = 2;
    d->further.push_back({5, {7, 8}});
    d->further.push_back({7, {9, 10}});
    // Either 6 is rejected (4 instead), or every draft is taken but the next token is 11, not 7.
    const std::vector<int32_t> rows =
        bonus_differs ? std::vector<int32_t>{5, 6, 11} : std::vector<int32_t>{5, 4, 0};
    auto got = spec_->Verify(7, *sampler, *d, 2, 3, Rows(rows), kVocab, 256, NoEog);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_FALSE(got->back().more) << "the head feeds the last token with new drafts";
    EXPECT_TRUE(d->further.empty());
    ASSERT_EQ(d->stale.size(), 2u);
    const std::vector<int32_t> history = sampler->history();
    // The stale windows arrive first, in order, and leave the sampler as it is.
    got = spec_->Verify(7, *sampler, *d, 5, 2, Rows({7, 8}), kVocab, 256, NoEog);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_TRUE(got->empty());
    got = spec_->Verify(7, *sampler, *d, 7, 2, Rows({9, 10}), kVocab, 256, NoEog);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(got->empty());
    EXPECT_EQ(sampler->history(), history);
    EXPECT_FALSE(spec_->Verify(7, *sampler, *d, 7, 2, Rows({9, 10}), kVocab, 256, NoEog).ok())
        << "a window neither drafted nor stale";
  }
}

TEST_F(OverlapTailTest, GuessedWindowsFollowTheDrafterOverTheGuessedHistory) {
  auto sampler = Sampler({1, 2, 3, 4, 1, 2, 3, 4, 1, 2});
  auto d = spec_->NewSession(7, false);
  d->pending = {3, 4};  // after the token at 9
  d->pending_pos = 9;
  std::vector<TokenMsg> out;
  spec_->DraftFurther(7, *sampler, *d, sampling_, 256, &out);
  // Three windows in flight: the pending one and two guessed, each K + 1 = 3 rows.
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].ahead);
  EXPECT_EQ(out[0].token.session, 7u);
  EXPECT_EQ(out[0].token.pos, 12u);
  EXPECT_EQ(out[0].token.id, 1);
  EXPECT_EQ(out[0].drafts, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(out[1].token.pos, 15u);
  EXPECT_EQ(out[1].token.id, 4);
  EXPECT_EQ(out[1].drafts, (std::vector<int32_t>{1, 2}));
  ASSERT_EQ(d->further.size(), 2u);
  EXPECT_EQ(spec_->counts().guessed, 2u);
  out.clear();
  spec_->DraftFurther(7, *sampler, *d, sampling_, 256, &out);
  EXPECT_TRUE(out.empty()) << "three windows are in flight already";
}

TEST_F(OverlapTailTest, NoGuessesWhileAcceptanceIsLowOrPastWhatStagesRollBack) {
  auto sampler = Sampler({1, 2, 3, 4, 1, 2, 3, 4, 1, 2});
  // A session starts at an acceptance of 0.6, under the 0.8 asked for.
  auto cautious = Spec(3, 0.8);
  auto d = cautious->NewSession(7, false);
  d->pending = {3, 4};
  d->pending_pos = 9;
  std::vector<TokenMsg> out;
  cautious->DraftFurther(7, *sampler, *d, sampling_, 256, &out);
  EXPECT_TRUE(out.empty());
  // A window of 8 checkpoints (WindowOptions' default) rolls back 8 rows: with K = 2, the
  // pending window's 2 drafts and two windows of 3 fit; a fourth window would not.
  auto wide = Spec(4, 0.0);
  d = wide->NewSession(7, false);
  d->pending = {3, 4};
  d->pending_pos = 9;
  wide->DraftFurther(7, *sampler, *d, sampling_, 256, &out);
  ASSERT_EQ(out.size(), 2u);
  int rows = 2;
  for (const TokenMsg& t : out) rows += 1 + static_cast<int>(t.drafts.size());
  EXPECT_LE(rows, window_->max_checkpoints());
}

}  // namespace
}  // namespace kvasir::ring
