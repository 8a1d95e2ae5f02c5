// The recompute auditor against real stages: rings of three stories260K stages keep their rows
// (StageOptions::row_store), a session runs, and each stage's reveal of the session's first
// positions is recomputed (audit/recompute.h). Honest stages pass; a stage started with the test
// fault (StageOptions::test_fault_noise, `--test-fault-noise`) commits to and reveals the rows it
// perturbed, which the reveal's check accepts and the recomputation catches.
#include <gtest/gtest.h>

#include "audit/recompute.h"
#include "ring/receipt.h"
#include "ring/ring_test_util.h"
#include "ring/row_store.h"
#include "ring/sampling_wire.h"
#include "ring/test_fault.h"
#include "test_assets.h"

namespace kvasir::audit {
namespace {

std::string Model() { return kvasir::testing::AssetPath("models/stories260K.gguf"); }

// Runs one greedy session on a ring whose stage `noisy` (or none: -1) perturbs every row it
// sends, and recomputes each stage's reveal of the first 12 positions. Returns the reports.
std::vector<RecomputeReport> RunAndRecompute(int noisy) {
  std::vector<std::shared_ptr<ring::RowStore>> stores;
  for (int i = 0; i < 3; ++i) {
    stores.push_back(std::make_shared<ring::RowStore>(ring::RowStoreOptions{}));
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint8_t> payload;
  auto local = kvasir::testing::LocalRing::Start(Model(), 3, wire::Dtype::kF16, 256, /*chunk=*/4,
                                                 256, [&](int i, ring::StageOptions& o) {
                                                   o.row_store = stores[i];
                                                   if (i == noisy) o.test_fault_noise = 1;
                                                   if (i == 0) {
                                                     o.on_receipt = [&](std::vector<uint8_t> p) {
                                                       std::lock_guard lock(mu);
                                                       payload = std::move(p);
                                                       cv.notify_all();
                                                     };
                                                   }
                                                 });
  EXPECT_NE(local, nullptr);
  if (local == nullptr) return {};
  auto client = ring::RingClient::Connect(local->head(), 20000, kvasir::testing::kTestRingSecret);
  EXPECT_TRUE(client.ok()) << client.status().message();
  if (!client.ok()) return {};
  ring::GenerateMsg req;
  req.prompt = "Once upon a time, there was a little";
  req.sampling = ring::SamplingToWire(kvasir::testing::Greedy(), 8, false);
  auto g = (*client)->Generate(req, [](const ring::TokenMsg&) {});
  EXPECT_TRUE(g.ok()) << g.status().message();
  std::unique_lock lock(mu);
  cv.wait_for(lock, std::chrono::seconds(20), [&] { return !payload.empty(); });
  auto r = ring::ParseReceipt(payload);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return {};
  auto file = GgufFile::Open(Model());
  EXPECT_TRUE(file.ok());
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  std::vector<RecomputeReport> reports;
  for (size_t s = 0; s < 3; ++s) {
    const ring::ReceiptLine& line = r->lines[s];
    std::vector<uint64_t> prefix;
    for (uint64_t i = 0; i < 12 && i < line.tokens; ++i) prefix.push_back(i);
    auto reveal = stores[s]->Reveal(r->id, prefix);
    EXPECT_TRUE(reveal.ok()) << reveal.status().message();
    if (!reveal.ok()) return {};
    // What the stage reveals is what it committed to, noise and all.
    EXPECT_TRUE(ring::CheckReveal(*reveal, line.rows_root, line.tokens).ok());
    auto rc =
        Recomputer::Load(shared, static_cast<int>(line.first), static_cast<int>(line.last), 1);
    EXPECT_TRUE(rc.ok()) << rc.status().message();
    if (!rc.ok()) return {};
    auto report = (*rc)->Check(*reveal, kDefaultTolerance);
    EXPECT_TRUE(report.ok()) << report.status().message();
    if (!report.ok()) return {};
    reports.push_back(*report);
  }
  return reports;
}

TEST(AuditRingTest, RealStagesPassAndANoisyStageIsCaught) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::vector<RecomputeReport> honest = RunAndRecompute(-1);
  ASSERT_EQ(honest.size(), 3u);
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_TRUE(honest[s].failure.empty()) << s << ": " << honest[s].failure;
    EXPECT_EQ(honest[s].compared, 12u) << s;
    EXPECT_LT(honest[s].worst, kDefaultTolerance / 4) << s;
  }
  EXPECT_EQ(honest[2].compared, 0u) << "the last stage gives out sampled tokens";

  if (!ring::TestFaultsBuilt()) GTEST_SKIP() << "a build without test faults";
  const std::vector<RecomputeReport> noisy = RunAndRecompute(1);
  ASSERT_EQ(noisy.size(), 3u);
  EXPECT_TRUE(noisy[0].failure.empty()) << noisy[0].failure;
  EXPECT_NE(noisy[1].failure.find("position 0: the revealed output differs"), std::string::npos)
      << noisy[1].failure;
  EXPECT_TRUE(noisy[2].failure.empty()) << "it computed honestly on the noisy rows it got";
}

}  // namespace
}  // namespace kvasir::audit
