// The rows a stage keeps for a replay (ring/replay_rows.h), alone: they run from position 0
// without a gap, a rollback cuts them, they come back bit for bit, and the byte budget drops whole
// sessions, the largest first, never leaving a session with a hole.
#include "ring/replay_rows.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvasir::ring {
namespace {

constexpr uint32_t kEmbd = 4;

// Rows [pos0, pos0 + n) of `session` whose values say where they come from.
HiddenMsg Rows(uint32_t session, uint32_t pos0, uint32_t n, float tag = 0) {
  std::vector<float> f;
  for (uint32_t r = 0; r < n; ++r) {
    for (uint32_t c = 0; c < kEmbd; ++c)
      f.push_back(tag + session * 1000.0f + (pos0 + r) + c / 8.0f);
  }
  return MakeHidden(session, pos0, n, kEmbd, wire::Dtype::kBF16, 0, f);
}

TEST(ReplayRowsTest, KeptRowsComeBackBitForBitAsSent) {
  ReplayRows rows(1 << 20);
  rows.Add(Rows(1, 0, 5));
  rows.Add(Rows(1, 5, 1));
  EXPECT_EQ(rows.kept(1), 6u);
  const HiddenMsg back = rows.Rows(1, 2, 3, wire::kHiddenSample);
  const HiddenMsg sent = Rows(1, 0, 5);
  EXPECT_EQ(back.dtype, wire::Dtype::kBF16);
  EXPECT_EQ(back.flags, wire::kHiddenSample);
  EXPECT_EQ(back.pos0, 2u);
  const size_t row = kEmbd * 2;
  EXPECT_EQ(back.data, std::vector<uint8_t>(sent.data.begin() + 2 * row, sent.data.end()));
}

TEST(ReplayRowsTest, ARollbackCutsAndAGapStopsKeeping) {
  ReplayRows rows(1 << 20);
  rows.Add(Rows(1, 0, 6));
  rows.Add(Rows(1, 4, 2, 500));  // rejected drafts: positions 4 and 5 again, other rows
  EXPECT_EQ(rows.kept(1), 6u);
  EXPECT_EQ(rows.Rows(1, 4, 2, 0).data, Rows(1, 4, 2, 500).data);
  EXPECT_NE(rows.Rows(1, 4, 2, 0).data, Rows(1, 4, 2).data);
  rows.Add(Rows(1, 8, 1));  // a gap: what is kept would have a hole
  EXPECT_EQ(rows.kept(1), 0u);
  rows.Add(Rows(1, 9, 1));  // nothing from position 0: not kept
  EXPECT_EQ(rows.kept(1), 0u);
  rows.Add(Rows(2, 3, 2));  // a session forked at position 3 has no rows before it
  EXPECT_EQ(rows.kept(2), 0u);
  EXPECT_EQ(rows.sessions(), 0u);
  rows.Add(Rows(3, 0, 4));
  rows.Truncate(3, 2);
  EXPECT_EQ(rows.kept(3), 2u);
}

TEST(ReplayRowsTest, TheBudgetDropsWholeSessionsLargestFirst) {
  const size_t row = kEmbd * 2;
  ReplayRows rows(100 * row);
  rows.Add(Rows(1, 0, 60));
  rows.Add(Rows(2, 0, 20));
  EXPECT_EQ(rows.sessions(), 2u);
  rows.Add(Rows(3, 0, 30));  // over the budget: session 1, the largest, goes
  EXPECT_LE(rows.bytes(), rows.max_bytes());
  EXPECT_EQ(rows.kept(1), 0u);
  EXPECT_EQ(rows.kept(2), 20u);
  EXPECT_EQ(rows.kept(3), 30u);
  EXPECT_EQ(rows.evicted(), 1u);
  rows.Add(Rows(1, 60, 1));  // the dropped session is not kept again from the middle
  EXPECT_EQ(rows.kept(1), 0u);
  rows.Add(Rows(4, 0, 200));  // larger than the whole budget: only itself goes
  EXPECT_EQ(rows.kept(4), 0u);
  EXPECT_EQ(rows.kept(2), 20u);
  EXPECT_EQ(rows.kept(3), 30u);
  rows.Retain([](uint32_t id) { return id != 2; });  // session 2 ended
  EXPECT_EQ(rows.kept(2), 0u);
  EXPECT_EQ(rows.sessions(), 1u);
  rows.Drop(3);
  EXPECT_EQ(rows.bytes(), 0u);
}

TEST(ReplayRowsTest, AZeroBudgetKeepsNothing) {
  ReplayRows rows(0);
  rows.Add(Rows(1, 0, 3));
  EXPECT_EQ(rows.kept(1), 0u);
  EXPECT_EQ(rows.bytes(), 0u);
}

}  // namespace
}  // namespace kvasir::ring
