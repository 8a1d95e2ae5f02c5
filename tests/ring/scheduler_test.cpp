// The stage's pure parts: how work becomes batches, the whole-or-each forward runner, the head's
// prompt checks and stop strings, and the tail's finish decisions.
#include <gtest/gtest.h>

#include <limits>

#include <fmt/format.h>

#include <set>

#include "gguf/gguf_file.h"
#include "ring/front_end.h"
#include "ring/sampling_wire.h"
#include "ring/scheduler.h"
#include "ring/tail_sampler.h"
#include "test_assets.h"

namespace kvasir::ring {
namespace {

Work Item(uint32_t session, int pos0, int n) {
  Work w;
  w.session = session;
  w.pos0 = pos0;
  w.n_tokens = n;
  w.tokens.assign(static_cast<size_t>(n), static_cast<int32_t>(session));
  return w;
}

bool All(uint32_t) { return true; }

// (session, pos0) of each item, for readable failures.
std::vector<std::pair<uint32_t, int>> Shape(const std::vector<Work>& batch) {
  std::vector<std::pair<uint32_t, int>> out;
  for (const Work& w : batch) out.emplace_back(w.session, w.pos0);
  return out;
}
using Shp = std::vector<std::pair<uint32_t, int>>;

TEST(BatchSchedulerTest, DecodeStepsGoBeforePromptChunks) {
  BatchScheduler s(256);
  s.AddPrefill(Item(1, 0, 64));
  s.AddDecode(Item(2, 10, 1));
  s.AddDecode(Item(3, 20, 1));
  EXPECT_EQ(Shape(s.NextBatch(All)), (Shp{{2, 10}, {3, 20}, {1, 0}}));
  EXPECT_EQ(s.size(), 0u);
  EXPECT_TRUE(s.NextBatch(All).empty());
}

TEST(BatchSchedulerTest, ASessionHasOneItemPerBatchInOrder) {
  BatchScheduler s(256);
  s.AddPrefill(Item(1, 0, 8));
  s.AddPrefill(Item(1, 8, 8));
  s.AddPrefill(Item(2, 0, 8));
  s.AddPrefill(Item(1, 16, 4));
  EXPECT_EQ(Shape(s.NextBatch(All)), (Shp{{1, 0}, {2, 0}}));
  EXPECT_EQ(Shape(s.NextBatch(All)), (Shp{{1, 8}}));
  EXPECT_EQ(Shape(s.NextBatch(All)), (Shp{{1, 16}}));
}

TEST(BatchSchedulerTest, RowLimitHoldsBackWithoutOvertaking) {
  BatchScheduler s(16);
  s.AddPrefill(Item(1, 0, 10));
  s.AddPrefill(Item(2, 0, 10));  // does not fit beside session 1
  s.AddPrefill(Item(3, 0, 6));   // fits
  s.AddPrefill(Item(2, 10, 2));  // must wait behind session 2's first chunk
  EXPECT_EQ(Shape(s.NextBatch(All)), (Shp{{1, 0}, {3, 0}}));
  EXPECT_EQ(Shape(s.NextBatch(All)), (Shp{{2, 0}}));
  EXPECT_EQ(Shape(s.NextBatch(All)), (Shp{{2, 10}}));
}

TEST(BatchSchedulerTest, AnItemLargerThanTheLimitRunsAlone) {
  BatchScheduler s(16);
  s.AddPrefill(Item(1, 0, 40));
  s.AddPrefill(Item(2, 0, 1));
  EXPECT_EQ(Shape(s.NextBatch(All)), (Shp{{1, 0}}));
  EXPECT_EQ(Shape(s.NextBatch(All)), (Shp{{2, 0}}));
}

TEST(BatchSchedulerTest, EndedSessionsAreDroppedAndClearEmpties) {
  BatchScheduler s(256);
  s.AddDecode(Item(1, 5, 1));
  s.AddPrefill(Item(2, 0, 4));
  s.AddPrefill(Item(3, 0, 4));
  EXPECT_EQ(Shape(s.NextBatch([](uint32_t id) { return id != 2; })), (Shp{{1, 5}, {3, 0}}));
  EXPECT_EQ(s.size(), 0u);
  s.AddPrefill(Item(4, 0, 4));
  s.Clear();
  EXPECT_TRUE(s.NextBatch(All).empty());
}

TEST(BatchSchedulerTest, TakeSessionTakesOnlyItsItemsInOrder) {
  BatchScheduler s(256);
  s.AddPrefill(Item(1, 0, 4));
  s.AddPrefill(Item(2, 0, 4));
  s.AddDecode(Item(2, 9, 1));
  s.AddPrefill(Item(2, 4, 4));
  s.AddDecode(Item(3, 7, 1));
  EXPECT_EQ(Shape(s.TakeSession(2)), (Shp{{2, 0}, {2, 4}, {2, 9}}));
  EXPECT_TRUE(s.TakeSession(2).empty());
  EXPECT_EQ(Shape(s.NextBatch(All)), (Shp{{3, 7}, {1, 0}}));
}

TEST(BatchSchedulerTest, ForwardInputConcatenatesItems) {
  std::vector<Work> items = {Item(7, 3, 2), Item(9, 0, 3)};
  items[1].sample = true;
  ForwardInput in;
  std::vector<int32_t> tokens;
  std::vector<float> hidden;
  BuildForwardInput(items, &in, &tokens, &hidden);
  ASSERT_EQ(in.chunks.size(), 2u);
  EXPECT_EQ(in.chunks[0].seq_id, 7);
  EXPECT_EQ(in.chunks[0].pos0, 3);
  EXPECT_FALSE(in.chunks[0].want_logits);
  EXPECT_TRUE(in.chunks[1].want_logits);
  EXPECT_EQ(std::vector<int32_t>(in.tokens.begin(), in.tokens.end()),
            (std::vector<int32_t>{7, 7, 9, 9, 9}));
  EXPECT_TRUE(in.hidden.empty());
}

// A fake forward pass: refuses any input holding a session in `bad`.
struct FakeForward {
  std::set<uint32_t> bad;
  int calls = 0;
  Status operator()(std::span<const Work> items, ForwardOutput* out) {
    ++calls;
    for (const Work& w : items) {
      if (bad.count(w.session)) return Error("session {} is refused", w.session);
    }
    out->logits.assign(items.size(), 1.0f);
    return Status::Ok();
  }
};

TEST(RunBatchOrEachTest, AGoodBatchRunsOnce) {
  FakeForward f;
  std::vector<Work> batch = {Item(1, 0, 1), Item(2, 0, 1)};
  int groups = 0;
  std::vector<uint32_t> failed;
  EXPECT_TRUE(RunBatchOrEach(
      batch, std::ref(f), [&](std::span<const Work> g, const ForwardOutput&) { groups += g.size() == 2; },
      [&](const Work& w, const Status&) { failed.push_back(w.session); }));
  EXPECT_EQ(f.calls, 1);
  EXPECT_EQ(groups, 1);
  EXPECT_TRUE(failed.empty());
}

TEST(RunBatchOrEachTest, ARefusedBatchFailsOnlyTheBadItem) {
  FakeForward f;
  f.bad = {2};
  std::vector<Work> batch = {Item(1, 0, 1), Item(2, 0, 1), Item(3, 0, 1)};
  std::vector<uint32_t> ran, failed;
  std::string why;
  EXPECT_FALSE(RunBatchOrEach(
      batch, std::ref(f),
      [&](std::span<const Work> g, const ForwardOutput&) {
        ASSERT_EQ(g.size(), 1u);
        ran.push_back(g[0].session);
      },
      [&](const Work& w, const Status& s) {
        failed.push_back(w.session);
        why = s.message();
      }));
  EXPECT_EQ(ran, (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(failed, (std::vector<uint32_t>{2}));
  EXPECT_EQ(why, "session 2 is refused");
  EXPECT_EQ(f.calls, 4);  // the batch, then each item alone
}

TEST(RunBatchOrEachTest, ARefusedSingleItemIsNotRetried) {
  FakeForward f;
  f.bad = {5};
  std::vector<Work> batch = {Item(5, 0, 1)};
  int failed = 0;
  RunBatchOrEach(
      batch, std::ref(f), [&](std::span<const Work>, const ForwardOutput&) { FAIL(); },
      [&](const Work&, const Status&) { ++failed; });
  EXPECT_EQ(f.calls, 1);
  EXPECT_EQ(failed, 1);
}

TEST(StopMatcherTest, FindsStopsAcrossPieces) {
  StopMatcher m({"The end", "", "!!"});
  EXPECT_FALSE(m.empty());
  EXPECT_FALSE(m.Feed("and that was The"));
  EXPECT_FALSE(m.Feed(" e"));
  EXPECT_TRUE(m.Feed("nd."));
  StopMatcher bang({"!!"});
  EXPECT_FALSE(bang.Feed("!"));
  EXPECT_TRUE(bang.Feed("!"));
  StopMatcher none({""});
  EXPECT_TRUE(none.empty());
  EXPECT_FALSE(none.Feed("anything"));
}

TEST(StopMatcherTest, LongGenerationsKeepOnlyATailAndLongStopsStillMatch) {
  const std::string stop(3000, 'x');  // longer than any fixed window
  StopMatcher m({stop});
  for (int i = 0; i < 2999; ++i) ASSERT_FALSE(m.Feed("x"));
  EXPECT_TRUE(m.Feed("x"));
  StopMatcher small({"STOP"});
  for (int i = 0; i < 100000; ++i) ASSERT_FALSE(small.Feed("word "));
  EXPECT_FALSE(small.Feed("ST"));
  EXPECT_TRUE(small.Feed("OP"));
}

TEST(TailSamplerTest, FinishReasonsInOrder) {
  wire::SamplingWire s{};
  s.max_tokens = 4;
  EXPECT_EQ(FinishReasonFor(false, s, 1, 10, 256), wire::FinishReason::kNone);
  EXPECT_EQ(FinishReasonFor(true, s, 4, 256, 256), wire::FinishReason::kEog);
  EXPECT_EQ(FinishReasonFor(false, s, 4, 256, 256), wire::FinishReason::kMaxTokens);
  EXPECT_EQ(FinishReasonFor(false, s, 2, 256, 256), wire::FinishReason::kContextFull);
  EXPECT_EQ(FinishReasonFor(false, s, 2, 255, 256), wire::FinishReason::kNone);
  s.flags = wire::kSamplingIgnoreEog;
  EXPECT_EQ(FinishReasonFor(true, s, 1, 10, 256), wire::FinishReason::kNone);
}

TEST(TailSamplerTest, GreedyTokenCarriesItsLogit) {
  SamplingParams p;
  p.temperature = 0;
  const wire::SamplingWire w = SamplingToWire(p, 2, false);
  auto made = TailSampler::Create(w, {1, 2}, 8, 4);
  ASSERT_TRUE(made.ok()) << made.status().message();
  TailSampler& t = **made;
  const std::vector<float> logits = {0.5f, -1.0f, 3.25f, 0.0f};
  wire::TokenBody b = t.Sample(9, logits, 2, 8, [](int32_t id) { return id == 3; })->token;
  EXPECT_EQ(b.session, 9u);
  EXPECT_EQ(b.id, 2);
  EXPECT_EQ(b.pos, 2u);
  EXPECT_EQ(b.logit, 3.25f);
  EXPECT_EQ(b.finished, 0);
  b = t.Sample(9, logits, 3, 8, [](int32_t id) { return id == 3; })->token;
  EXPECT_EQ(b.finished, 1);
  EXPECT_EQ(b.reason, static_cast<uint8_t>(wire::FinishReason::kMaxTokens));
  EXPECT_EQ(t.n_generated(), 2);
}

// The last stage never samples with values it could not honour: they are refused, by name.
TEST(TailSamplerTest, RefusesWhatItCannotSampleWith) {
  wire::SamplingWire w = SamplingToWire(SamplingParams{}, 2, false);
  w.temperature = std::numeric_limits<float>::quiet_NaN();
  auto nan = TailSampler::Create(w, {1, 2}, 8, 4);
  ASSERT_FALSE(nan.ok());
  EXPECT_NE(nan.status().message().find("temperature"), std::string::npos);
  w = SamplingToWire(SamplingParams{}, 2, false);
  w.top_k = std::numeric_limits<int32_t>::min();
  EXPECT_FALSE(TailSampler::Create(w, {1, 2}, 8, 4).ok());
  w = SamplingToWire(SamplingParams{}, 2, false);
  auto id = TailSampler::Create(w, {1, 4}, 8, 4);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("outside the vocabulary"), std::string::npos);
  EXPECT_FALSE(TailSampler::Create(w, std::vector<int32_t>(8, 1), 8, 4).ok()) << "no room";
}

class FrontEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KV_REQUIRE_ASSET("models/stories260K.gguf");
    const std::string path = testing::AssetPath("models/stories260K.gguf");
    auto file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok());
    auto tok = Tokenizer::FromGguf(file->header(), path);
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    tok_ = std::move(tok).value();
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(FrontEndTest, PromptChecksNameTheSizes) {
  GenerateMsg g;
  g.add_special = false;
  g.prompt = "";
  EXPECT_EQ(EncodePrompt(*tok_, g, 64).status().message(), "the prompt is empty");
  g.prompt = "Once upon a time";
  auto ids = EncodePrompt(*tok_, g, 64);
  ASSERT_TRUE(ids.ok());
  const int n = static_cast<int>(ids->size());
  EXPECT_EQ(*ids, tok_->Encode(g.prompt, false, true));
  // A prompt that fills the context leaves no room for a token: refused; one less fits.
  EXPECT_EQ(EncodePrompt(*tok_, g, n).status().message(),
            fmt::format("the prompt has {} tokens but the context is {}", n, n));
  EXPECT_TRUE(EncodePrompt(*tok_, g, n + 1).ok());
}

TEST_F(FrontEndTest, TokensGetPiecesAndStopStringsFinishThem) {
  const std::vector<int32_t> ids = tok_->Encode(" big red ball", false);
  ASSERT_GE(ids.size(), 2u);
  StopMatcher stops({"red"});
  TokenMsg t;
  t.token.session = 4;
  t.token.logit = 1.5f;
  std::string text;
  bool stopped = false;
  for (int32_t id : ids) {
    t.token.id = id;
    TokenMsg out = PresentToken(t, *tok_, 3, &stops);
    EXPECT_EQ(out.token.n_prompt, 3u);
    EXPECT_EQ(out.token.logit, 1.5f);
    EXPECT_EQ(out.token.piece_bytes, out.piece.size());
    if (out.token.finished) {
      EXPECT_EQ(out.token.reason, static_cast<uint8_t>(wire::FinishReason::kStopString));
      EXPECT_TRUE(out.piece.empty());
      stopped = true;
      break;
    }
    text += out.piece;
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text.find("red"), std::string::npos);
  // A token already finished by the tail keeps its reason and its piece.
  t.token.finished = 1;
  t.token.reason = static_cast<uint8_t>(wire::FinishReason::kMaxTokens);
  TokenMsg last = PresentToken(t, *tok_, 3, &stops);
  EXPECT_EQ(last.token.reason, static_cast<uint8_t>(wire::FinishReason::kMaxTokens));
  EXPECT_EQ(last.piece, tok_->TokenToPiece(t.token.id));
}

}  // namespace
}  // namespace kvasir::ring
