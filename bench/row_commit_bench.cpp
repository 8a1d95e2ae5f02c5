// What a stage's row commitments cost per position it runs (docs/PROTOCOL.md, "Row
// commitments"): the leaf hash of one f32 row in and one f16 row out, the Merkle builder, and,
// when the row store keeps rows, the copy into it. Arguments: n_embd, and whether rows are kept.
#include <benchmark/benchmark.h>

#include <memory>

#include "ring/row_store.h"

namespace {

using kvasir::ring::PositionRows;
using kvasir::ring::RowKind;
using kvasir::ring::RowStore;
using kvasir::ring::RowStoreOptions;
using kvasir::ring::SessionRows;

void BM_CommitPosition(benchmark::State& state) {
  const auto n_embd = static_cast<size_t>(state.range(0));
  const bool keep = state.range(1) != 0;
  PositionRows p;
  p.in = {RowKind::kF32, std::vector<uint8_t>(n_embd * 4, 0x3c)};
  p.out = {RowKind::kF16, std::vector<uint8_t>(n_embd * 2, 0x5a)};
  // A session of 4096 positions at most, then a new one (as a stage's sessions come and go).
  auto store = std::make_shared<RowStore>(RowStoreOptions{size_t{1} << 31, 600});
  SessionRows rows(keep ? store : nullptr);
  for (auto _ : state) {
    if (rows.size() == 4096) {
      state.PauseTiming();
      rows = SessionRows(keep ? store : nullptr);
      state.ResumeTiming();
    }
    p.pos = static_cast<uint32_t>(rows.size());
    rows.Add(p);
  }
  benchmark::DoNotOptimize(rows.Root());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n_embd * 6));
}
BENCHMARK(BM_CommitPosition)
    ->ArgsProduct({{64, 2048, 4096, 8192}, {0, 1}})
    ->ArgNames({"n_embd", "keep"});

}  // namespace

BENCHMARK_MAIN();
