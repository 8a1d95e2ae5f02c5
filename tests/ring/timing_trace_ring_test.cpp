// --trace-timing on a ring in one process: every stage writes each step of a session, in the
// order the rows cross the ring, and the head cuts the prompt into equal chunks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/timing_trace.h"
#include "ring_test_util.h"
#include "test_assets.h"
#include "timing_trace_util.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::FindTrace;
using testing::GenerateOnRing;
using testing::Greedy;
using testing::LocalRing;
using testing::ParseTrace;
using testing::TraceEvent;

// 9 tokens with BOS: in chunks of at most 4 rows, 3 + 3 + 3 (not 4 + 4 + 1).
constexpr const char* kPrompt = "Once upon a time there was a little";

TEST(TimingTraceRingTest, EveryStageTracesTheRowsInTheOrderTheyCrossTheRing) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  auto ring = LocalRing::Start(AssetPath("models/stories260K.gguf"), 3, wire::Dtype::kF32, 256,
                               /*chunk=*/4);
  ASSERT_NE(ring, nullptr);
  EnableTimingTrace(true);
  ::testing::internal::CaptureStderr();
  const auto generated = GenerateOnRing(ring->head(), kPrompt, Greedy(), 3);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EnableTimingTrace(false);
  ASSERT_FALSE(generated.ids.empty());
  const std::vector<TraceEvent> events = ParseTrace(err);

  const TraceEvent* open = FindTrace(events, "s0", "open_out");
  ASSERT_NE(open, nullptr) << err;
  const int n_prompt = std::stoi(open->fields.at("tokens"));
  ASSERT_EQ(n_prompt, 9);
  // The head's prompt chunks: equal within a row, at most 4, covering the prompt in order.
  std::vector<int> rows;
  int next = 0;
  for (const TraceEvent& e : events) {
    if (e.who == "s0" && e.event == "compute_start" && next < n_prompt) {
      EXPECT_EQ(std::stoi(e.fields.at("pos0")), next);
      rows.push_back(std::stoi(e.fields.at("rows")));
      next += rows.back();
    }
  }
  ASSERT_EQ(rows.size(), static_cast<size_t>((n_prompt + 3) / 4)) << err;
  int sum = 0;
  for (int r : rows) {
    sum += r;
    EXPECT_LE(r, 4);
    EXPECT_GE(r, rows.front() - 1);
    EXPECT_LE(r, rows.front() + 1);
  }
  EXPECT_EQ(sum, n_prompt);

  // The last chunk crosses s0 -> s1 -> s2 and comes back as a token: each step no earlier than
  // the one before it.
  const std::string last = std::to_string(n_prompt - rows.back());
  const std::vector<const TraceEvent*> chain = {
      FindTrace(events, "s0", "compute_start", last), FindTrace(events, "s0", "compute_end", last),
      FindTrace(events, "s0", "hidden_out", last),    FindTrace(events, "s1", "hidden_in", last),
      FindTrace(events, "s1", "compute_start", last), FindTrace(events, "s1", "compute_end", last),
      FindTrace(events, "s1", "hidden_out", last),    FindTrace(events, "s2", "hidden_in", last),
      FindTrace(events, "s2", "compute_start", last), FindTrace(events, "s2", "compute_end", last),
      FindTrace(events, "s2", "token_out"),           FindTrace(events, "s0", "token_in")};
  for (size_t i = 0; i < chain.size(); ++i) {
    ASSERT_NE(chain[i], nullptr) << "step " << i << " missing:\n" << err;
    EXPECT_EQ(chain[i]->fields.at("session"), open->fields.at("session")) << i;
    if (i > 0) {
      EXPECT_GE(chain[i]->us, chain[i - 1]->us) << "step " << i;
    }
  }
}

}  // namespace
}  // namespace kvasir
