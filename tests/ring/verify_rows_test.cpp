// Speculation's rules alone: which rows a stage drops before a session's next chunk, and what the
// codec lets through of drafts on TOKEN and verify chunks on HIDDEN.
#include "ring/verify_rows.h"

#include <gtest/gtest.h>

#include <cstring>

#include "ring/frame.h"
#include "ring/messages.h"
#include "tail_test_util.h"

namespace kvasir::ring {
namespace {

using testing::RoundTrip;

TEST(KeepBeforeChunk, AChunkThatContinuesTheSessionUndoesNothing) {
  EXPECT_EQ(*KeepBeforeChunk({}, 10, 10), 10);
  EXPECT_EQ(*KeepBeforeChunk({5, 5}, 10, 10), 10) << "every draft accepted";
  // Chunks may wait in the queue: rows past the length are Forward's to judge.
  EXPECT_EQ(*KeepBeforeChunk({}, 10, 74), 10);
}

TEST(KeepBeforeChunk, RejectedDraftsAreDroppedUpToTheFedToken) {
  // A verify chunk at 5 of 5 rows (the token and 4 drafts): the next chunk starts after the last
  // accepted row.
  for (int pos0 = 6; pos0 <= 9; ++pos0) EXPECT_EQ(*KeepBeforeChunk({5, 5}, 10, pos0), pos0);
}

TEST(KeepBeforeChunk, RowsThatWereNotDraftsAreNeverUndone) {
  EXPECT_FALSE(KeepBeforeChunk({5, 5}, 10, 5).ok()) << "the fed token was decided";
  EXPECT_FALSE(KeepBeforeChunk({5, 5}, 10, 3).ok()) << "before the verify chunk";
  EXPECT_FALSE(KeepBeforeChunk({}, 10, 9).ok()) << "no verify chunk ran";
  EXPECT_FALSE(KeepBeforeChunk({5, 5}, 12, 8).ok()) << "rows ran after the verify chunk";
  const Status s = KeepBeforeChunk({5, 5}, 10, 2).status();
  EXPECT_NE(s.message().find("position 2"), std::string::npos) << s.message();
}

TEST(SpeculationWire, TokenCarriesItsDraftsAndTheMoreFlag) {
  TokenMsg t;
  t.token.session = 3;
  t.token.pos = 17;
  t.token.id = 42;
  t.drafts = {7, 8, 9};
  auto back = RoundTrip(t);
  ASSERT_TRUE(back.ok()) << back.status().message();
  const auto& got = std::get<TokenMsg>(*back);
  EXPECT_EQ(got.drafts, t.drafts);
  EXPECT_FALSE(got.more);
  TokenMsg more = t;
  more.drafts.clear();
  more.more = true;
  back = RoundTrip(more);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(std::get<TokenMsg>(*back).more);
  EXPECT_TRUE(std::get<TokenMsg>(*back).drafts.empty());
}

TEST(SpeculationWire, BadDraftCountsAreRefused) {
  TokenMsg t;
  t.token.session = 3;
  t.drafts.assign(wire::kMaxDraftTokens + 1, 1);
  EXPECT_FALSE(CheckEncodable(t).ok()) << "more drafts than the bound";
  t.drafts = {1, -2};
  EXPECT_FALSE(CheckEncodable(t).ok()) << "a negative id";
  t.drafts = {1, 2};
  t.more = true;
  EXPECT_FALSE(CheckEncodable(t).ok()) << "drafts follow the last token only";
  t.more = false;
  t.token.finished = 1;
  EXPECT_FALSE(CheckEncodable(t).ok()) << "no drafts after the last token of a session";

  // A frame whose draft count lies is refused by the decoder.
  TokenMsg ok;
  ok.token.session = 3;
  ok.drafts = {5};
  std::vector<uint8_t> bytes = EncodeMessage(ok);
  // The count is the u32 before the last id: make it 2 with one id present, then 0.
  const size_t count_at = bytes.size() - 2 * sizeof(int32_t);
  for (uint32_t lie : {2u, 0u, wire::kMaxDraftTokens + 1}) {
    std::memcpy(bytes.data() + count_at, &lie, sizeof(lie));
    FrameDecoder decoder;
    decoder.Feed(bytes);
    auto frame = decoder.Next();
    ASSERT_TRUE(frame.ok() && frame->has_value());
    EXPECT_FALSE(DecodeMessage(**frame).ok()) << "n_drafts " << lie;
  }
}

TEST(SpeculationWire, VerifyChunksAreBounded) {
  const std::vector<float> rows(4 * 2, 0.5f);
  HiddenMsg h =
      MakeHidden(1, 0, 4, 2, wire::Dtype::kF32, wire::kHiddenSample | wire::kHiddenVerify, rows);
  auto back = RoundTrip(h);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(std::get<HiddenMsg>(*back).flags, wire::kHiddenSample | wire::kHiddenVerify);
  h.flags = wire::kHiddenVerify;
  EXPECT_FALSE(CheckEncodable(h).ok()) << "a verify chunk samples";
  h.flags = 0x80;
  EXPECT_FALSE(CheckEncodable(h).ok()) << "unknown bits";
  const std::vector<float> one(2, 0.5f);
  EXPECT_FALSE(CheckEncodable(MakeHidden(1, 0, 1, 2, wire::Dtype::kF32,
                                         wire::kHiddenSample | wire::kHiddenVerify, one))
                   .ok())
      << "a verify chunk without drafts";
  const std::vector<float> many((wire::kMaxDraftTokens + 2) * 2, 0.5f);
  EXPECT_FALSE(CheckEncodable(MakeHidden(1, 0, wire::kMaxDraftTokens + 2, 2, wire::Dtype::kF32,
                                         wire::kHiddenSample | wire::kHiddenVerify, many))
                   .ok())
      << "more drafts than the bound";
}

TEST(SpeculationWire, StatsCarryTheDraftCountsOfEveryRecord) {
  StatsMsg m;
  m.records.resize(2);
  m.drafts.resize(2);
  std::strncpy(m.drafts[1].drafter, "ngram", sizeof(m.drafts[1].drafter) - 1);
  m.drafts[1].drafted = 40;
  m.drafts[1].accepted = 31;
  auto back = RoundTrip(m);
  ASSERT_TRUE(back.ok()) << back.status().message();
  const auto& got = std::get<StatsMsg>(*back);
  ASSERT_EQ(got.drafts.size(), 2u);
  EXPECT_STREQ(got.drafts[1].drafter, "ngram");
  EXPECT_EQ(got.drafts[1].accepted, 31u);
  EXPECT_EQ(got.drafts[0].drafted, 0u);
  m.drafts.pop_back();
  EXPECT_FALSE(CheckEncodable(m).ok()) << "one draft record per stage record";
  StatsMsg plain;
  plain.records.resize(3);
  back = RoundTrip(plain);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(std::get<StatsMsg>(*back).drafts.empty()) << "no drafting, the frame as before";
}

}  // namespace
}  // namespace kvasir::ring
