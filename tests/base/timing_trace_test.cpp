#include "base/timing_trace.h"

#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <string>

namespace kvasir {
namespace {

TEST(TimingTrace, OffWritesNothing) {
  EnableTimingTrace(false);
  testing::internal::CaptureStderr();
  TraceTiming("stage0", "hidden_in", "session={} rows={}", 7, 57);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(TimingTrace, OnWritesOneLineWithWallClockMicroseconds) {
  EnableTimingTrace(true);
  const auto before = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  testing::internal::CaptureStderr();
  TraceTiming("stage0", "hidden_in", "session={} rows={}", 7, 57);
  const std::string out = testing::internal::GetCapturedStderr();
  EnableTimingTrace(false);
  std::istringstream line(out);
  std::string tag, who, event, session, rows;
  int64_t us = 0;
  line >> tag >> us >> who >> event >> session >> rows;
  EXPECT_EQ(tag, "[timing]");
  EXPECT_GE(us, before);
  EXPECT_LT(us, before + 60'000'000);
  EXPECT_EQ(who, "stage0");
  EXPECT_EQ(event, "hidden_in");
  EXPECT_EQ(session, "session=7");
  EXPECT_EQ(rows, "rows=57");
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(out.find('\n'), out.size() - 1);  // one line
}

}  // namespace
}  // namespace kvasir
