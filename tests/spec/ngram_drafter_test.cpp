// Prompt lookup proposes what followed the latest earlier occurrence of the history's tail.
#include "spec/ngram_drafter.h"

#include <gtest/gtest.h>

namespace kvasir::spec {
namespace {

std::vector<int32_t> Propose(Drafter& d, const std::vector<int32_t>& history, int k) {
  auto r = d.Propose(history, k);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : std::vector<int32_t>{};
}

TEST(NgramDrafterTest, ProposesWhatFollowedTheLatestMatch) {
  NgramDrafter d(2, 4);
  // "7 8" occurred twice before; the latest is followed by 5 6.
  const std::vector<int32_t> h = {7, 8, 1, 2, 3, 7, 8, 5, 6, 9, 7, 8};
  EXPECT_EQ(Propose(d, h, 2), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(Propose(d, h, 4), (std::vector<int32_t>{5, 6, 9, 7}));
}

TEST(NgramDrafterTest, LongerMatchesWin) {
  NgramDrafter d(1, 3);
  // The 1-gram "3" last occurred before 9, but the 3-gram "1 2 3" before 4.
  const std::vector<int32_t> h = {1, 2, 3, 4, 5, 3, 9, 1, 2, 3};
  EXPECT_EQ(Propose(d, h, 2), (std::vector<int32_t>{4, 5}));
}

TEST(NgramDrafterTest, StopsAtTheEndOfTheHistory) {
  NgramDrafter d(2, 4);
  const std::vector<int32_t> h = {4, 4, 4};  // "4 4" at 0, followed only by the last 4
  EXPECT_EQ(Propose(d, h, 5), (std::vector<int32_t>{4}));
}

TEST(NgramDrafterTest, NoMatchNoDrafts) {
  NgramDrafter d(2, 4);
  EXPECT_TRUE(Propose(d, {1, 2, 3, 4, 5}, 4).empty());
  EXPECT_TRUE(Propose(d, {1}, 4).empty());
  EXPECT_TRUE(Propose(d, {}, 4).empty());
  EXPECT_TRUE(Propose(d, {1, 2, 1, 2}, 0).empty());
}

TEST(DraftKindTest, ParsesTheChoicesAndRefusesOthers) {
  EXPECT_EQ(*ParseDraftKind("auto"), DraftKind::kAuto);
  EXPECT_EQ(*ParseDraftKind("ngram"), DraftKind::kNgram);
  EXPECT_EQ(*ParseDraftKind("model"), DraftKind::kModel);
  EXPECT_EQ(*ParseDraftKind("none"), DraftKind::kNone);
  EXPECT_EQ(*ParseDraftKind("mtp"), DraftKind::kMtp);
  auto bad = ParseDraftKind("medusa");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--draft medusa"), std::string::npos);
  EXPECT_NE(bad.status().message().find("mtp"), std::string::npos);
}

}  // namespace
}  // namespace kvasir::spec
