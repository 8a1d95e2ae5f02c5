// Audits end to end in one process: a market (MarketApi over a Store) credits the sessions of a
// ring of three stories260K windows run as stages run them (stage_sim.h), picks sessions to audit,
// the holders reveal from their row stores on their heartbeats, and the recompute auditor
// (audit/auditor.h) recomputes the revealed windows. A stage that adds noise to the rows it sends
// (ring/test_fault.h) is caught at a 5 % audit rate within 100 sessions and forfeits the audited
// session's credit; 1,000 honest sessions, all audited, computed at SIMD targets of different widths
// (and on OpenCL where this machine has a device) and recomputed on the CPU at another width, raise
// no false alarm.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "audit/auditor.h"
#include "kernels/simd_target.h"
#include "kvasir_process.h"
#include "market/audit.h"
#include "market/market_fixture.h"
#include "model/model_id.h"
#include "ring/row_store.h"
#include "stage_sim.h"

namespace kvasir::audit {
namespace {

using kvasir::testing::Body;
using market::kT0;
using nlohmann::json;
namespace ki = kvasir::kernels_internal;

constexpr int kFirst[3] = {0, 2, 4}, kLast[3] = {2, 4, 5};

class AuditLoopTest : public market::MarketFixture {
 protected:
  void SetUp() override {
    KV_REQUIRE_ASSET("models/stories260K.gguf");
    auto f = GgufFile::Open(kvasir::testing::AssetPath("models/stories260K.gguf"));
    ASSERT_TRUE(f.ok()) << f.status().message();
    file_ = std::make_shared<const GgufFile>(std::move(f).value());
    auto id = ComputeModelId(file_->header(), file_->path());
    ASSERT_TRUE(id.ok());
    // The market's view of it: "tiny" (what the fixture claims), three windows.
    market::ModelSpec m;
    m.name = "tiny";
    m.model_id = ModelIdHex(*id);
    m.url = "http://files.invalid/stories260K.gguf";
    m.n_layer = 5;
    m.ctx = 256;
    m.max_rows_per_s = 1e6;
    std::vector<market::WindowSpec> ring;
    for (int w = 0; w < 3; ++w) {
      market::WindowSpec win;
      win.first = kFirst[w];
      win.last = kLast[w];
      win.bytes = 1000;
      win.memory = 100000;
      win.tensors.push_back(
          {"blk." + std::to_string(kFirst[w]) + ".attn_q.weight", std::string(64, 'a')});
      ring.push_back(win);
    }
    m.rings.push_back(ring);
    Open(m, Config(0.05));
    LoadWindows("cpu", windows_);
  }
  // The three stages' windows on `backend`.
  void LoadWindows(const std::string& backend, std::unique_ptr<LayerWindow>* windows) {
    for (int w = 0; w < 3; ++w) {
      WindowSpec spec{kFirst[w], kLast[w], w == 0, w == 2};
      WindowOptions o;
      o.backend = backend;
      auto lw = LayerWindow::Load(file_, spec, o);
      ASSERT_TRUE(lw.ok()) << backend << ": " << lw.status().message();
      windows[w] = std::move(lw).value();
    }
  }
  static market::MarketConfig Config(double rate) {
    market::MarketConfig c{7200, 120, "", "", {}, {}};
    c.audit.rate = rate;
    c.audit.prefix = market::kDefaultAuditPrefix;
    c.audit.ban_s = 100;
    c.audit.seed = 25;  // which sessions are audited: repeatable
    return c;
  }
  std::unique_ptr<Auditor> MakeAuditor(double now) {
    AuditorOptions o;
    o.model = "tiny";
    auto a = Auditor::Create(store_.get(), file_, o, now);
    EXPECT_TRUE(a.ok()) << a.status().message();
    return a.ok() ? std::move(a).value() : nullptr;
  }

  // Session `n`: a prompt and a few decoded rows through the three windows, the middle one
  // perturbing its rows with probability `noise`; each holder keeps its rows and signs its line.
  // `windows`: the three stages' windows (windows_ unless given).
  ring::Receipt RunSession(uint32_t n, std::mt19937& rng, double noise,
                           const std::unique_ptr<LayerWindow>* windows = nullptr) {
    if (windows == nullptr) windows = windows_;
    const int len = 4 + static_cast<int>(rng() % 21);
    const int prompt = 1 + static_cast<int>(rng() % len);
    std::vector<int32_t> tokens;
    for (int i = 0; i < len; ++i) tokens.push_back(static_cast<int32_t>(rng() % 512));
    StageRun runs[3];
    runs[0] = RunAsStage(windows[0].get(), tokens, {}, len, prompt, ring::RowKind::kF16);
    runs[1] =
        RunAsStage(windows[1].get(), {}, runs[0].next_in, len, prompt, ring::RowKind::kF16, noise);
    runs[2] = RunAsStage(windows[2].get(), {}, runs[1].next_in, len, prompt, ring::RowKind::kF16);
    ring::Receipt r;
    r.id.fill(0x3c);
    std::memcpy(r.id.data(), &n, sizeof(n));
    r.session = n;
    const std::string& hex = store_model_id_();
    for (size_t i = 0; i < r.model_id.size(); ++i) {
      r.model_id[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    }
    for (int w = 0; w < 3; ++w) {
      ring::SessionRows rows(stores_[w]);
      for (auto& p : runs[w].rows) rows.Add(std::move(p));
      const ring::Digest root = rows.Root();
      stores_[w]->Put(n, std::move(rows));
      stores_[w]->Bind(n, root, r.id);
      ring::AppendReceiptLine(&r, keys_[w], static_cast<uint32_t>(kFirst[w]),
                              static_cast<uint32_t>(kLast[w]), static_cast<uint64_t>(len), root);
    }
    return r;
  }
  const std::string& store_model_id_() {
    if (model_id_.empty()) {
      model_id_ = ModelIdHex(ComputeModelId(file_->header(), file_->path()).value());
    }
    return model_id_;
  }

  // Every holder answers the audits its heartbeat brings from its row store. Returns whether
  // any was asked.
  bool AnswerAudits(const std::vector<int64_t>& ids, int64_t epoch, const ring::Receipt& r,
                    double now) {
    bool asked = false;
    for (int w = 0; w < 3; ++w) {
      json body = {{"claim", ids[w]}, {"serving_epoch", epoch}};
      market::ApiResponse beat = api_->Handle(
          kvasir::testing::Signed(keys_[w], "POST", "/v1/heartbeat", body.dump(), now), now);
      if (beat.status != 200) continue;  // evicted
      auto requests = market::ParseAuditRequests(Body(beat));
      EXPECT_TRUE(requests.ok());
      if (!requests.ok() || requests->empty()) continue;
      asked = true;
      EXPECT_EQ((*requests)[0].receipt, ring::ReceiptIdHex(r));
      auto reveal = stores_[w]->Reveal(r.id, (*requests)[0].positions);
      body["reveals"] = json::array({market::AuditAnswerToJson((*requests)[0].id, reveal)});
      market::ApiResponse a = api_->Handle(
          kvasir::testing::Signed(keys_[w], "POST", "/v1/heartbeat", body.dump(), now), now);
      EXPECT_EQ(a.status, 200) << a.body;
    }
    return asked;
  }

  json BalanceOf(int w, double now) {
    json b = Body(api_->Handle(kvasir::testing::Plain("GET", "/v1/balances"), now));
    for (const json& x : b["balances"]) {
      if (x["node"] == ring::PublicKeyHex(keys_[w].public_key())) return x;
    }
    return json();
  }

  std::shared_ptr<const GgufFile> file_;
  std::string model_id_;
  std::unique_ptr<LayerWindow> windows_[3];
  std::shared_ptr<ring::RowStore> stores_[3] = {
      std::make_shared<ring::RowStore>(ring::RowStoreOptions{}),
      std::make_shared<ring::RowStore>(ring::RowStoreOptions{}),
      std::make_shared<ring::RowStore>(ring::RowStoreOptions{})};
};

TEST_F(AuditLoopTest, ANoisyStageIsCaughtWithin100SessionsAt5PercentAndForfeitsTheSession) {
  if (!ring::TestFaultsBuilt()) GTEST_SKIP() << "a build without test faults";
  const auto ids = FillRing(kT0);
  const int64_t epoch = MakeReady(ids, kT0);
  auto auditor = MakeAuditor(kT0);
  ASSERT_NE(auditor, nullptr);
  std::mt19937 rng(3);
  double now = kT0 + 1;
  int caught_at = 0;
  for (uint32_t n = 1; n <= 100 && caught_at == 0; ++n, now += 1) {
    const ring::Receipt r = RunSession(n, rng, /*noise=*/0.5);
    const double before =
        BalanceOf(1, now)["credit"].is_number() ? BalanceOf(1, now)["credit"].get<double>() : 0.0;
    market::ApiResponse sub = Submit(r, now);
    ASSERT_EQ(sub.status, 200) << sub.body;
    if (!AnswerAudits(ids, epoch, r, now)) continue;
    auto handled = auditor->RunOnce(now);
    ASSERT_TRUE(handled.ok()) << handled.status().message();
    EXPECT_EQ(*handled, 3) << "the three lines of the audited session";
    const json b = BalanceOf(1, now);
    if (b["audits_failed"] == 1) {
      caught_at = static_cast<int>(n);
      EXPECT_DOUBLE_EQ(b["credit"].get<double>(), before) << "the audited session earns nothing";
      // Its key is banned and its window free; the honest holders passed.
      EXPECT_EQ(Claim(keys_[1], 1, now + 1).status, 403);
      EXPECT_EQ(RingJson(now + 1)["windows"][1]["state"], "uncovered");
      EXPECT_EQ(BalanceOf(0, now)["audits_failed"], 0);
      EXPECT_EQ(BalanceOf(2, now)["audits_failed"], 0);
    }
  }
  std::printf("[ figures ] the noisy stage (noise on half its rows) was caught at session %d\n",
              caught_at);
  EXPECT_GT(caught_at, 0) << "not caught within 100 sessions";
  EXPECT_EQ(auditor->stats().failed, 1);
}

TEST_F(AuditLoopTest, AThousandHonestAuditedSessionsAcrossSimdTargetsRaiseNoFalseAlarm) {
  MakeApi(Config(1.0));  // every session audited
  const auto ids = FillRing(kT0);
  const int64_t epoch = MakeReady(ids, kT0);
  // One auditor judges the sessions the CPU computed, another (on the same database) those
  // OpenCL computed, so that each reports its own worst difference.
  auto auditor = MakeAuditor(kT0);
  ASSERT_NE(auditor, nullptr);
  const std::vector<int64_t> targets = ki::AvailableSimdTargets();
  // Where this machine has an OpenCL device, every (targets + 1)th session runs on it.
  const std::string no_opencl = NoOpenClDevice();
  std::unique_ptr<LayerWindow> opencl[3];
  std::unique_ptr<Auditor> opencl_auditor;
  if (no_opencl.empty()) {
    LoadWindows("opencl", opencl);
    opencl_auditor = MakeAuditor(kT0);
    ASSERT_NE(opencl_auditor, nullptr);
  }
  const size_t variants = targets.size() + (no_opencl.empty() ? 1 : 0);
  std::mt19937 rng(4);
  double now = kT0 + 1;
  constexpr uint32_t kSessions = 1000;
  uint32_t on_opencl = 0;
  for (uint32_t n = 1; n <= kSessions; ++n, now += 1) {
    const size_t v = n % variants;
    const bool cl = v == targets.size();
    if (!cl) ki::ForceSimdTarget(targets[v]);
    const ring::Receipt r = RunSession(n, rng, 0, cl ? opencl : windows_);
    ASSERT_EQ(Submit(r, now).status, 200);
    ASSERT_TRUE(AnswerAudits(ids, epoch, r, now));
    ki::ForceSimdTarget(targets[(n + 1) % targets.size()]);
    auto handled = (cl ? opencl_auditor : auditor)->RunOnce(now);
    ASSERT_TRUE(handled.ok()) << handled.status().message();
    ASSERT_EQ(*handled, 3);
    on_opencl += cl ? 1 : 0;
  }
  ki::ForceSimdTarget(0);
  const AuditorStats& st = auditor->stats();
  const AuditorStats on_cl = opencl_auditor ? opencl_auditor->stats() : AuditorStats{};
  EXPECT_EQ(st.passed + on_cl.passed, 3 * kSessions);
  EXPECT_EQ(st.failed + on_cl.failed, 0);
  EXPECT_EQ(st.skipped + on_cl.skipped, 0);
  EXPECT_EQ(on_cl.passed, 3 * on_opencl);
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(BalanceOf(w, now)["audits_passed"], kSessions) << w;
    EXPECT_EQ(BalanceOf(w, now)["audits_failed"], 0) << w;
  }
  std::printf(
      "[ figures ] %u honest sessions on %zu SIMD targets: worst difference %.3g, "
      "tolerance %.3g (margin %.1fx)\n",
      kSessions - on_opencl, targets.size(), st.worst_passed, kDefaultTolerance,
      kDefaultTolerance / st.worst_passed);
  if (on_opencl > 0) {
    std::printf(
        "[ figures ] %u honest sessions on OpenCL, audited on the CPU: worst difference %.3g, "
        "tolerance %.3g (margin %.1fx)\n",
        on_opencl, on_cl.worst_passed, kDefaultTolerance, kDefaultTolerance / on_cl.worst_passed);
  } else {
    std::printf("[ figures ] no session on OpenCL: %s\n", no_opencl.c_str());
  }
}

// `kvasir audit` on the market's database, as the market's operator runs it: it refuses a model
// file that is not the registered model and bad flags, and with --once recomputes what waits,
// fails the noisy holder and prints the tally.
TEST_F(AuditLoopTest, TheAuditCommandRecomputesWhatWaitsOnTheMarketsDatabase) {
  if (!ring::TestFaultsBuilt()) GTEST_SKIP() << "a build without test faults";
  MakeApi(Config(1.0));
  const auto ids = FillRing(kT0);
  const int64_t epoch = MakeReady(ids, kT0);
  std::mt19937 rng(8);
  const ring::Receipt r = RunSession(1, rng, /*noise=*/1.0);
  ASSERT_EQ(Submit(r, kT0 + 1).status, 200);
  ASSERT_TRUE(AnswerAudits(ids, epoch, r, kT0 + 1));
  const std::string model = kvasir::testing::AssetPath("models/stories260K.gguf");

  kvasir::testing::ExpectUsageError(
      kvasir::testing::RunKvasir({"audit", "--db", db_, "-m", model, "--tolerance", "0"}), "audit",
      "--tolerance");
  kvasir::testing::ExpectRuntimeError(
      kvasir::testing::RunKvasir({"audit", "--db", db_, "-m",
                                  kvasir::testing::AssetPath("models/stories260K-q8_0.gguf"),
                                  "--name", "tiny", "--once"}),
      "audit", "is not that of 'tiny'");
  const kvasir::testing::RunResult run =
      kvasir::testing::RunKvasir({"audit", "--db", db_, "-m", model, "--name", "tiny", "--once"});
  ASSERT_EQ(run.code, 0) << kvasir::testing::Describe(run);
  EXPECT_NE(run.out.find("audit: 2 passed, 1 failed, 0 skipped"), std::string::npos) << run.out;
  // The market's processes see the verdict in the database.
  EXPECT_EQ(BalanceOf(1, kT0 + 2)["audits_failed"], 1);
  EXPECT_EQ(BalanceOf(0, kT0 + 2)["audits_passed"], 1);
}

}  // namespace
}  // namespace kvasir::audit
