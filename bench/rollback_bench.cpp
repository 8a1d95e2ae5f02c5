// Rolling back a verify batch on a hybrid (DeltaNet) model: keeping a checkpoint of the recurrent
// state before each row of the batch (the rows then run one at a time through the recurrence)
// against recomputing the accepted rows after restoring the state from before the batch.
//   KVASIR_BENCH_MODEL=path.gguf build/bin/rollback_bench   (default: the shared qwen35moe fixture)
// Each iteration verifies K + 1 = 5 rows after a 32-token prefix and keeps 1 + j of them
// (the argument); the prefix is rebuilt outside the timed part.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>

#include "base/check.h"
#include "model/arch/registry.h"
#include "model/layer_window.h"

namespace kvasir {
namespace {

constexpr int kPrefix = 32, kRows = 5;

std::string ModelPath() {
  if (const char* m = std::getenv("KVASIR_BENCH_MODEL"); m != nullptr && *m != '\0') return m;
  const char* assets = std::getenv("KVASIR_ASSETS");
  return std::string(assets != nullptr ? assets : "../shared") + "/models/synth-qwen35moe-f32.gguf";
}

LayerWindow& Window() {
  static std::unique_ptr<LayerWindow> w = [] {
    auto file = GgufFile::Open(ModelPath());
    KV_CHECK(file.ok(), "{}", file.status().message());
    auto shared = std::make_shared<const GgufFile>(std::move(file).value());
    auto cfg = LoadModelConfig(*shared);
    KV_CHECK(cfg.ok(), "{}", cfg.status().message());
    WindowOptions opt;
    opt.n_ctx = 256;
    const char* t = std::getenv("KVASIR_BENCH_THREADS");
    opt.n_threads = t != nullptr ? std::atoi(t) : 1;
    auto loaded = LayerWindow::Load(shared, {0, cfg->n_layer, true, true}, opt);
    KV_CHECK(loaded.ok(), "{}", loaded.status().message());
    return std::move(loaded).value();
  }();
  return *w;
}

std::vector<int32_t> Ids(int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 37 + 5) % Window().config().n_vocab);
  return ids;
}

void Run(LayerWindow& w, const std::vector<int32_t>& ids, int pos0, int n, int n_checkpoints) {
  ForwardInput in;
  SeqChunk ch{0, pos0, n};
  ch.n_checkpoints = n_checkpoints;
  in.chunks = {ch};
  in.tokens = std::span<const int32_t>(ids).subspan(pos0, n);
  in.all_logits = true;
  ForwardOutput out;
  KV_CHECK(w.Forward(in, &out).ok());
}

void Prefix(LayerWindow& w, const std::vector<int32_t>& ids) {
  if (w.SequenceLength(0) < 0) KV_CHECK(w.OpenSequence(0).ok());
  KV_CHECK(w.TruncateSequence(0, 0).ok());
  Run(w, ids, 0, kPrefix, 0);
}

// The batch with a checkpoint before every row, then the rollback to the accepted rows.
void BM_VerifyCheckpointed(benchmark::State& state) {
  LayerWindow& w = Window();
  const std::vector<int32_t> ids = Ids(kPrefix + 2 * kRows);
  const int keep = kPrefix + 1 + static_cast<int>(state.range(0));
  for (auto _ : state) {
    state.PauseTiming();
    Prefix(w, ids);
    state.ResumeTiming();
    Run(w, ids, kPrefix, kRows, kRows);
    KV_CHECK(w.TruncateSequence(0, keep).ok());
  }
}

// The batch as one call, then the accepted rows run again from the state before it (the restore
// of that one state is left out: it costs what one checkpoint does).
void BM_VerifyRecomputed(benchmark::State& state) {
  LayerWindow& w = Window();
  const std::vector<int32_t> ids = Ids(kPrefix + 2 * kRows);
  const int keep = 1 + static_cast<int>(state.range(0));
  for (auto _ : state) {
    state.PauseTiming();
    Prefix(w, ids);
    state.ResumeTiming();
    Run(w, ids, kPrefix, kRows, 0);
    if (keep < kRows) Run(w, ids, kPrefix + kRows, keep, 0);  // the same work as the accepted rows
  }
}

// The batch alone, kept whole: the floor both are measured against.
void BM_VerifyNoRollback(benchmark::State& state) {
  LayerWindow& w = Window();
  const std::vector<int32_t> ids = Ids(kPrefix + 2 * kRows);
  for (auto _ : state) {
    state.PauseTiming();
    Prefix(w, ids);
    state.ResumeTiming();
    Run(w, ids, kPrefix, kRows, 0);
  }
}

BENCHMARK(BM_VerifyCheckpointed)->Arg(0)->Arg(2)->Arg(4)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_VerifyRecomputed)->Arg(0)->Arg(2)->Arg(4)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_VerifyNoRollback)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvasir

BENCHMARK_MAIN();
