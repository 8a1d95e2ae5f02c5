// A cached continuation on a ring: the head cuts it into chunks by work (src/ring/chunk_plan.h),
// the stages run those chunks, and the answer is an uncached ring's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/timing_trace.h"
#include "gguf/gguf_file.h"
#include "model/arch/registry.h"
#include "ring/chunk_plan.h"
#include "ring/client.h"
#include "ring/sampling_wire.h"
#include "ring_test_util.h"
#include "test_assets.h"
#include "timing_trace_util.h"

namespace kvasir::testing {
namespace {

using Reply = CachedAnswer;

Reply Ask(const std::string& head, const std::string& prompt, int n) {
  return AskReportingCache(head, prompt, n);
}

std::unique_ptr<LocalRing> Ring(const std::string& model, int n_stages, int chunk,
                                uint64_t cache_bytes) {
  return LocalRing::Start(model, n_stages, wire::Dtype::kF32, 512, chunk, 256,
                          [=](int, ring::StageOptions& o) { o.cache_bytes = cache_bytes; });
}

// A chat's first turn (`n_first` tokens answered), then a second turn that extends it with
// `more`: the second turn's new rows attend to the whole first turn, so they cost several fresh
// rows each. The head cuts them into more chunks than the row cap `chunk` alone would, the head
// stage runs exactly those chunks, and the answer equals an uncached ring's.
void ExpectCutByWorkAndAnsweredAsUncached(const char* model_asset, int n_stages, int chunk,
                                          const std::string& first, int n_first,
                                          const std::string& more) {
  const std::string model = AssetPath(model_asset);
  auto file = GgufFile::Open(model);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto cfg = LoadModelConfig(*file);
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();

  auto cached = Ring(model, n_stages, chunk, 64 << 20);
  ASSERT_NE(cached, nullptr);
  const Reply a = Ask(cached->head(), first, n_first);
  const std::string second = first + a.text + more;
  EnableTimingTrace(true);
  ::testing::internal::CaptureStderr();
  const Reply b = Ask(cached->head(), second, 16);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EnableTimingTrace(false);
  cached.reset();
  ASSERT_GT(b.n_cached, 40) << "the first turn's positions were not taken over";

  const std::vector<TraceEvent> events = ParseTrace(err);
  const TraceEvent* open = FindTrace(events, "s0", "open_out");
  ASSERT_NE(open, nullptr) << err;
  ASSERT_EQ(std::stoi(open->fields.at("cached")), b.n_cached);
  const int n_new = std::stoi(open->fields.at("tokens")) - b.n_cached;
  const std::vector<int> plan =
      ring::PlanChunks(ring::RowCostOf(*cfg, AttnType::kF32), b.n_cached, n_new, chunk);
  ASSERT_GT(plan.size(), static_cast<size_t>((n_new + chunk - 1) / chunk))
      << "not cut by work: " << n_new << " new rows after " << b.n_cached;
  std::vector<int> ran;  // the head stage's prompt chunks of the second turn
  for (int next = b.n_cached; const TraceEvent& e : events) {
    if (e.who == "s0" && e.event == "compute_start" &&
        e.fields.at("session") == open->fields.at("session") &&
        std::stoi(e.fields.at("pos0")) == next && next < b.n_cached + n_new) {
      ran.push_back(std::stoi(e.fields.at("rows")));
      next += ran.back();
    }
  }
  EXPECT_EQ(ran, plan) << err;

  auto plain = Ring(model, n_stages, chunk, 0);
  ASSERT_NE(plain, nullptr);
  const Reply b0 = Ask(plain->head(), second, 16);
  EXPECT_EQ(b0.n_cached, 0);
  EXPECT_EQ(b.ids, b0.ids);
  EXPECT_EQ(b.text, b0.text);
}

TEST(ChunkRingTest, ACachedContinuationCutInSeveralChunksAnswersAsUncached) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  ExpectCutByWorkAndAnsweredAsUncached(
      "models/stories260K.gguf", 3, 16,
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she saw a big tree with red apples.",
      48, " Lily picked an apple and gave it to her mom.");
}

// The hybrid MoE model: its DeltaNet layers attend to nothing, its attention layers do; the kept
// recurrent state is taken over at its exact end (the first turn's prompt, one token answered).
TEST(ChunkRingTest, AHybridMoeContinuationCutInSeveralChunksAnswersAsUncached) {
  KV_REQUIRE_ASSET("models/synth-qwen35moe-f32.gguf");
  ExpectCutByWorkAndAnsweredAsUncached(
      "models/synth-qwen35moe-f32.gguf", 2, 8,
      "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat by the "
      "window, and the birds sing in the tall green trees of the quiet old garden.",
      1, " Then the dog wakes up and runs after the fox.");
}

}  // namespace
}  // namespace kvasir::testing
