// The draft length follows the measured acceptance: up to the cap while drafts are taken, pausing
// (longer each time) while they are not, and back to drafting after a probe is accepted.
#include "spec/draft_budget.h"

#include <gtest/gtest.h>

namespace kvasir::spec {
namespace {

TEST(DraftBudgetTest, AcceptedDraftsReachTheCap) {
  DraftBudget b(4);
  for (int i = 0; i < 10; ++i) {
    const int k = b.Next();
    ASSERT_GE(k, 1);
    b.Record(k, k);
  }
  EXPECT_EQ(b.Next(), 4);
  EXPECT_GT(b.acceptance(), 0.9);
}

TEST(DraftBudgetTest, HalfAcceptedDraftsAreShorter) {
  DraftBudget b(8);
  for (int i = 0; i < 20; ++i) b.Record(4, 2);
  EXPECT_EQ(b.Next(), 2);  // a run of 1 on average, plus one
}

TEST(DraftBudgetTest, RejectedDraftsPauseLongerEachTime) {
  DraftBudget b(4);
  int drafted_steps = 0, steps = 0;
  std::vector<int> pauses;
  int run = 0;
  for (; steps < 400; ++steps) {
    const int k = b.Next();
    if (k == 0) {
      ++run;
      continue;
    }
    if (run > 0) pauses.push_back(run);
    run = 0;
    ++drafted_steps;
    b.Record(k, 0);
  }
  // Pauses grow 4, 8, 16, 32, 64, 64, ...: few steps still draft.
  ASSERT_GE(pauses.size(), 5u);
  EXPECT_EQ(pauses[0], 4);
  EXPECT_EQ(pauses[1], 8);
  EXPECT_EQ(pauses[4], 64);
  EXPECT_LT(drafted_steps, 20);
}

TEST(DraftBudgetTest, AnAcceptedProbeResumesDrafting) {
  DraftBudget b(4);
  while (b.acceptance() >= 0.15) b.Record(4, 0);
  int k = b.Next();
  while (k == 0) k = b.Next();
  EXPECT_EQ(k, 1);  // the probe
  b.Record(1, 1);
  EXPECT_GE(b.Next(), 1);
  EXPECT_GT(b.acceptance(), 0.15);
}

TEST(DraftBudgetTest, ACapOfZeroNeverDrafts) {
  DraftBudget b(0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(b.Next(), 0);
}

TEST(DraftBudgetTest, NotAdaptiveAlwaysDraftsTheCap) {
  DraftBudget b(3, /*adaptive=*/false);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(b.Next(), 3);
    b.Record(3, 0);
  }
}

}  // namespace
}  // namespace kvasir::spec
