// The model's own multi-token-prediction (nextn) block drafting on the ring's last stage: the
// stage's Forward returns the hidden rows, the rows it keeps reach each session's MtpDrafter, and
// greedy output equals the output without speculation token for token, on a synthetic qwen35moe
// with one nextn block (`kvasir synth --nextn 1`), rings of 1, 3 and 4 stages, 8 sessions at once.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "kvasir_process.h"
#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "ring/spec_tail.h"
#include "ring_test_util.h"
#include "spec_ring_util.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::LocalRing;
using testing::TempDir;

constexpr char kStories[] = "models/stories260K.gguf";

// A 4-layer qwen35moe with one nextn block and stories260K's vocabulary, f32 weights. Random
// weights make the block a poor guesser; with seed 24 one of its drafts after "Once upon a time"
// is accepted, so a verify chunk keeps more than its first row.
std::string SynthWithNextn(const TempDir& dir) {
  const std::string out = dir.File("qwen35moe-nextn.gguf");
  std::vector<std::string> args = testing::HybridSynthArgs(out, "qwen35moe", "f32", "24");
  args.insert(args.end(), {"--nextn", "1"});
  const testing::RunResult r = testing::RunKvasir(args);
  EXPECT_EQ(r.code, 0) << r.err;
  return out;
}

std::unique_ptr<LocalRing> StartMtpRing(const std::string& model, int n_stages,
                                        spec::DraftKind kind) {
  return testing::StartDraftingRing(model, n_stages, testing::DraftWith(kind));
}

// Eight sessions at once on rings of 1, 3 and 4 stages, with --draft mtp and with auto (which picks
// mtp on a model with a nextn block): the greedy tokens and their logits are exactly those of
// one process without speculation, and the last stage drafted with its nextn block.
TEST(SpecRingMtp, GreedyOutputEqualsNonSpeculative) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string model = SynthWithNextn(dir);
  const int n_predict = 40;
  const std::vector<testing::Generation> local = testing::GreedyLocally(model, n_predict);
  for (int n_stages : {1, 3, 4}) {
    for (spec::DraftKind kind : {spec::DraftKind::kMtp, spec::DraftKind::kAuto}) {
      auto ring = StartMtpRing(model, n_stages, kind);
      ASSERT_NE(ring, nullptr);
      testing::ExpectGreedySessionsEqual(ring->head(), local, n_predict,
                                         std::to_string(n_stages) + " stages");
      const ring::DraftTotals totals = ring->stage(n_stages - 1).draft_totals();
      EXPECT_EQ(totals.drafter, "mtp") << n_stages << " stages";
      EXPECT_GT(totals.steps, 0u) << n_stages << " stages: no verify chunk ran";
      EXPECT_GT(totals.drafted, 0u);
      EXPECT_GT(totals.accepted, 0u) << "the draft after \"Once upon a time\" is accepted";
      RecordProperty("accepted_" + std::to_string(n_stages), std::to_string(totals.accepted));
      RecordProperty("drafted_" + std::to_string(n_stages), std::to_string(totals.drafted));
    }
  }
}

// --draft mtp on a last stage whose window has no nextn block is refused, naming the block.
TEST(SpecRingMtp, RefusedWithoutANextnBlock) {
  KV_REQUIRE_ASSET(kStories);
  auto file = GgufFile::Open(AssetPath(kStories));
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  auto cfg = LoadModelConfig(*shared);
  ASSERT_TRUE(cfg.ok());
  WindowOptions opt;
  opt.n_ctx = 64;
  auto w = LayerWindow::Load(shared, {0, cfg->n_layer, true, true}, opt);
  ASSERT_TRUE(w.ok()) << w.status().message();
  spec::DraftOptions o;
  o.kind = spec::DraftKind::kMtp;
  auto tail = ring::SpecTail::Create(o, **w);
  ASSERT_FALSE(tail.ok());
  EXPECT_NE(tail.status().message().find("multi-token-prediction block"), std::string::npos)
      << tail.status().message();
  // auto falls back to prompt lookup there.
  o.kind = spec::DraftKind::kAuto;
  auto fallback = ring::SpecTail::Create(o, **w);
  ASSERT_TRUE(fallback.ok()) << fallback.status().message();
  ASSERT_NE(*fallback, nullptr);
  EXPECT_EQ((*fallback)->counts().drafter, "ngram");
}

}  // namespace
}  // namespace kvasir
