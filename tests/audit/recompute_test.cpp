// The recompute auditor's check of one window (audit/recompute.h) against windows run as stages
// run them (stage_sim.h): honest rows pass whatever SIMD width computed them and whatever the
// boundary type, within the stated tolerance with room to spare; perturbed rows, rows of the wrong
// kind and a reveal without its prefix are caught.
#include "audit/recompute.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>

#include "kernels/simd_target.h"
#include "model/arch/registry.h"
#include "ring/row_store.h"
#include "stage_sim.h"
#include "test_assets.h"

namespace kvasir::audit {
namespace {

namespace ki = kvasir::kernels_internal;

std::shared_ptr<const GgufFile> OpenModel(const std::string& name) {
  auto f = GgufFile::Open(kvasir::testing::AssetPath("models/" + name));
  EXPECT_TRUE(f.ok()) << f.status().message();
  return std::make_shared<const GgufFile>(std::move(f).value());
}

std::unique_ptr<LayerWindow> StageWindow(std::shared_ptr<const GgufFile> file, int first, int last,
                                         int n_layer, const std::string& backend = "cpu") {
  WindowSpec spec{first, last, first == 0, last == n_layer};
  WindowOptions o;
  o.backend = backend;
  auto w = LayerWindow::Load(std::move(file), spec, o);
  EXPECT_TRUE(w.ok()) << w.status().message();
  return w.ok() ? std::move(w).value() : nullptr;
}

// The reveal of positions [0, prefix) of `rows`, as a holder's row store gives it.
ring::RowReveal Reveal(const std::vector<ring::PositionRows>& rows, uint64_t prefix) {
  auto store = std::make_shared<ring::RowStore>(ring::RowStoreOptions{});
  ring::SessionRows session(store);
  for (const auto& p : rows) session.Add(p);
  const ring::Digest root = session.Root();
  ring::ReceiptId id{};
  store->Put(1, std::move(session));
  store->Bind(1, root, id);
  std::vector<uint64_t> indices;
  for (uint64_t i = 0; i < prefix && i < rows.size(); ++i) indices.push_back(i);
  auto r = store->Reveal(id, indices);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return std::move(r).value();
}

std::vector<int32_t> Tokens(std::mt19937& rng, int n, int n_vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng() % n_vocab));
  return t;
}

// The models of ../shared the tolerance is measured on: f32 and quantized, four architectures.
const char* const kModels[] = {"stories260K.gguf",      "stories260K-q8_0.gguf",
                               "stories260K-q4_0.gguf", "synth-qwen3-q4_0.gguf",
                               "synth-qwen2-q8_0.gguf", "synth-llama-q4_k_m.gguf",
                               "synth-llama31-f32.gguf"};

// Where a stage computes: a backend, and for the CPU the SIMD target it is held to.
struct StageAt {
  std::string backend;
  int64_t target = 0;  // ki::ForceSimdTarget's value; 0 for a device
  std::string Name() const {
    return backend == "cpu" ? ki::SimdTargetNameOf(target) : backend;
  }
};

// `model`'s honest windows, a head [0, a) and, with 3 layers or more, a middle window
// [a, n_layer - 1) (no output head: its rows are compared), computed by a stage at each of
// `stages` with each boundary type and recomputed by the auditor on the CPU at every SIMD target
// this CPU has. Every check must pass; returns the worst difference, and where it was in `where`.
double WorstHonestDifference(const std::string& model, const std::vector<StageAt>& stages,
                             std::string* where) {
  const std::vector<int64_t> targets = ki::AvailableSimdTargets();
  auto file = OpenModel(model);
  auto config = LoadModelConfig(*file);
  EXPECT_TRUE(config.ok()) << config.status().message();
  if (!config.ok()) return 0;
  const int n_layer = config->n_layer;
  EXPECT_GE(n_layer, 2) << model;
  const int a = std::max(1, (n_layer - 1) / 2);
  const bool has_middle = a < n_layer - 1;
  auto auditor_head = Recomputer::Load(file, 0, a, 1);
  EXPECT_TRUE(auditor_head.ok()) << auditor_head.status().message();
  auto auditor_mid = Recomputer::Load(file, a, has_middle ? n_layer - 1 : n_layer, 1);
  EXPECT_TRUE(auditor_mid.ok()) << auditor_mid.status().message();
  if (!auditor_head.ok() || !auditor_mid.ok()) return 0;
  double worst = 0;
  std::mt19937 rng(11);
  // One pair of windows per backend (a CPU window runs at whatever target is forced).
  std::map<std::string, std::pair<std::unique_ptr<LayerWindow>, std::unique_ptr<LayerWindow>>>
      windows;
  for (const StageAt& at : stages) {
    if (windows.contains(at.backend)) continue;
    auto& [head, middle] = windows[at.backend];
    head = StageWindow(file, 0, a, n_layer, at.backend);
    if (has_middle) middle = StageWindow(file, a, n_layer - 1, n_layer, at.backend);
    if (!head || (has_middle && !middle)) return 0;
  }
  for (const ring::RowKind boundary :
       {ring::RowKind::kF32, ring::RowKind::kF16, ring::RowKind::kBF16}) {
    for (const StageAt& at : stages) {
      LayerWindow* head = windows[at.backend].first.get();
      LayerWindow* middle = windows[at.backend].second.get();
      ki::ForceSimdTarget(at.target);
      const std::vector<int32_t> tokens = Tokens(rng, 24, head->config().n_vocab);
      StageRun h = RunAsStage(head, tokens, {}, 24, 9, boundary);
      StageRun m;
      if (has_middle) m = RunAsStage(middle, {}, h.next_in, 24, 9, boundary);
      for (int64_t audit_target : targets) {
        ki::ForceSimdTarget(audit_target);
        for (int which = 0; which < (has_middle ? 2 : 1); ++which) {
          const auto& rows = which == 0 ? h.rows : m.rows;
          Recomputer* r = which == 0 ? auditor_head->get() : auditor_mid->get();
          auto report = r->Check(Reveal(rows, 12), kDefaultTolerance);
          EXPECT_TRUE(report.ok()) << report.status().message();
          if (!report.ok()) continue;
          EXPECT_TRUE(report->failure.empty())
              << model << " (" << at.Name() << " stage): " << report->failure;
          if (report->worst > worst) {
            worst = report->worst;
            *where = at.Name() + " stage, " + ki::SimdTargetNameOf(audit_target) +
                     " auditor, boundary kind " + std::to_string(static_cast<int>(boundary));
          }
        }
      }
    }
  }
  ki::ForceSimdTarget(0);
  return worst;
}

// Honest windows, computed by a stage at every SIMD target this CPU has and recomputed by the
// auditor at every target: the worst difference, per model, stays under half the tolerance.
TEST(RecomputeTest, HonestWindowsPassAcrossSimdTargetsAndBoundaryTypes) {
  std::vector<StageAt> stages;
  for (int64_t t : ki::AvailableSimdTargets()) stages.push_back({"cpu", t});
  for (const std::string model : kModels) {
    KV_REQUIRE_ASSET("models/" + model);
    std::string where;
    const double worst = WorstHonestDifference(model, stages, &where);
    std::printf("[ figures ] %s: worst honest difference %.3g (%s), tolerance %.3g\n",
                model.c_str(), worst, where.c_str(), kDefaultTolerance);
    EXPECT_LT(worst, kDefaultTolerance / 2) << model << ": " << where;
  }
}

// The same windows computed by a stage on OpenCL (its own kernels: another order of sums, its
// own dequantization and attention) and recomputed by the auditor on the CPU at every SIMD
// target: an honest OpenCL holder passes too, under half the tolerance.
TEST(RecomputeTest, HonestOpenClWindowsPassTheCpuAuditor) {
  if (const std::string why = NoOpenClDevice(); !why.empty()) GTEST_SKIP() << why;
  for (const std::string model : kModels) {
    KV_REQUIRE_ASSET("models/" + model);
    std::string where;
    const double worst = WorstHonestDifference(model, {{"opencl", 0}}, &where);
    std::printf("[ figures ] %s: worst honest difference %.3g (%s), tolerance %.3g\n",
                model.c_str(), worst, where.c_str(), kDefaultTolerance);
    EXPECT_LT(worst, kDefaultTolerance / 2) << model << ": " << where;
  }
}

TEST(RecomputeTest, PerturbedRowsWrongKindsAndMissingPrefixesAreCaught) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  if (!ring::TestFaultsBuilt()) GTEST_SKIP() << "a build without test faults";
  auto file = OpenModel("stories260K.gguf");
  auto head = StageWindow(file, 0, 2, 5);
  auto auditor = Recomputer::Load(file, 0, 2, 1);
  ASSERT_TRUE(auditor.ok()) << auditor.status().message();
  std::mt19937 rng(5);
  const std::vector<int32_t> tokens = Tokens(rng, 16, head->config().n_vocab);

  // Every row perturbed: caught at position 0.
  StageRun noisy = RunAsStage(head.get(), tokens, {}, 16, 6, ring::RowKind::kF16, 1.0);
  auto r = (*auditor)->Check(Reveal(noisy.rows, 12), kDefaultTolerance);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_NE(r->failure.find("position 0: the revealed output differs"), std::string::npos)
      << r->failure;
  EXPECT_GT(r->worst, 0.05);

  // One row of the prefix changed after the fact (committed to as changed): caught there.
  StageRun honest = RunAsStage(head.get(), tokens, {}, 16, 6, ring::RowKind::kF32);
  std::vector<ring::PositionRows> bent = honest.rows;
  float v;
  std::memcpy(&v, bent[7].out.bytes.data() + 8, 4);
  v += 1.0f;
  std::memcpy(bent[7].out.bytes.data() + 8, &v, 4);
  r = (*auditor)->Check(Reveal(bent, 12), kDefaultTolerance);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->failure.find("position 7:"), std::string::npos) << r->failure;
  // Past the prefix the auditor sees nothing of it: position 7 is not recomputed with a prefix
  // of 7.
  r = (*auditor)->Check(Reveal(bent, 7), kDefaultTolerance);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->failure.empty()) << r->failure;
  EXPECT_EQ(r->compared, 7u);

  // Rows the window cannot have produced: a hidden row where the head takes a token.
  std::vector<ring::PositionRows> wrong = honest.rows;
  wrong[0].in = wrong[0].out;
  r = (*auditor)->Check(Reveal(wrong, 4), kDefaultTolerance);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->failure.find("position 0: the head's input is not a token id"), std::string::npos)
      << r->failure;

  // Nothing to judge: no position 0, or a session that began at a cached position.
  ring::RowReveal no_zero = Reveal(honest.rows, 4);
  no_zero.positions.erase(no_zero.positions.begin());
  EXPECT_FALSE((*auditor)->Check(no_zero, kDefaultTolerance).ok());
  std::vector<ring::PositionRows> cached = honest.rows;
  for (auto& p : cached) p.pos += 3;
  auto c = (*auditor)->Check(Reveal(cached, 4), kDefaultTolerance);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cached prompt"), std::string::npos);
}

}  // namespace
}  // namespace kvasir::audit
