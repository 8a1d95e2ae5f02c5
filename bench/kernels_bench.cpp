// MatMul benchmarks: decode (one token, memory-bound; reports GB/s of weights streamed) and prefill
// (128 tokens, compute-bound; reports GFLOP/s, 2 flops per multiply-add) for the matrix shapes of a
// 2048-wide model, in Q4_0, Q8_0, F16 and the K-quants of Q4_K_M/Q5_K_M files (Q4_K, Q5_K, Q6_K),
// on 1 and 2 threads. KQuants times the other quantized types once (one thread, 5632 x 2048).
//
//   build-kernels/bin/kernels_bench --benchmark_filter=Decode --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
//   KVASIR_SIMD_TARGET=AVX2 build-kernels/bin/kernels_bench ...   (force a lower SIMD target)
//
// Decode cycles through enough copies of the matrix (>= 256 MiB) that the weights come from DRAM,
// as they do in a real model, rather than from the last-level cache. DecodeBatch does the same for
// the small batches (1, 2, 4, 8 tokens) of continuous batching, which should cost little more than
// one token since the weights are read once.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"
#include "kernels/simd_target.h"

namespace kvasir {
namespace {

constexpr size_t kDecodeBytes = size_t{256} << 20;
constexpr int64_t kMaxDecodeBatch = 8;  // larger batches are timed as prefill (cache-resident)

struct BenchMatrix {
  std::vector<uint8_t> bytes;  // `copies` copies of one [rows, cols] matrix, back to back
  std::vector<MatrixView> views;
  size_t matrix_bytes = 0;
};

BenchMatrix MakeBenchMatrix(TensorType type, int64_t rows, int64_t cols, size_t min_bytes) {
  BenchMatrix m;
  const size_t row_bytes = RowBytes(type, cols);
  m.matrix_bytes = row_bytes * static_cast<size_t>(rows);
  const size_t copies = std::max<size_t>(1, (min_bytes + m.matrix_bytes - 1) / m.matrix_bytes);
  m.bytes.resize(m.matrix_bytes * copies);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : row) v = dist(rng);
    ref::QuantizeRow(type, row.data(), cols, m.bytes.data() + static_cast<size_t>(r) * row_bytes);
  }
  for (size_t c = 0; c < copies; ++c) {
    uint8_t* dst = m.bytes.data() + c * m.matrix_bytes;
    if (c > 0) std::memcpy(dst, m.bytes.data(), m.matrix_bytes);
    m.views.push_back(MatrixView{type, dst, rows, cols, row_bytes});
  }
  return m;
}

// Args: type id, rows, cols, tokens, threads, cached (1: one matrix, cache-resident when small).
void BM_MatMul(benchmark::State& state) {
  const auto type = static_cast<TensorType>(state.range(0));
  const int64_t rows = state.range(1);
  const int64_t cols = state.range(2);
  const int64_t n_tokens = state.range(3);
  const int threads = static_cast<int>(state.range(4));
  const bool decode = n_tokens <= kMaxDecodeBatch;
  const bool cached = state.range(5) != 0;
  const BenchMatrix m = MakeBenchMatrix(type, rows, cols, decode && !cached ? kDecodeBytes : 0);
  std::vector<float> x(static_cast<size_t>(n_tokens * cols));
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& v : x) v = dist(rng);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows));
  ThreadPool pool(threads);
  size_t next = 0;
  for (auto _ : state) {
    MatMul(m.views[next], x.data(), n_tokens, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    next = next + 1 == m.views.size() ? 0 : next + 1;
  }
  if (decode) {
    state.counters["GB/s"] = benchmark::Counter(static_cast<double>(m.matrix_bytes) / 1e9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  } else {
    state.counters["GFLOP/s"] =
        benchmark::Counter(2.0 * static_cast<double>(rows * cols * n_tokens) / 1e9,
                           benchmark::Counter::kIsIterationInvariantRate);
  }
  state.SetLabel(TensorTypeName(static_cast<uint32_t>(type)) + (decode ? " decode" : " prefill"));
}

// On a shared machine the fastest repetition is the least disturbed one.
double MinOf(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

void MatMulArgs(benchmark::internal::Benchmark* b, int64_t n_tokens) {
  for (TensorType type : {TensorType::kQ4_0, TensorType::kQ8_0, TensorType::kF16, TensorType::kQ4_K,
                          TensorType::kQ5_K, TensorType::kQ6_K}) {
    for (int64_t rows : {2048, 5632}) {
      for (int64_t threads : {1, 2}) {
        b->Args({static_cast<int64_t>(type), rows, 2048, n_tokens, threads, 0});
      }
    }
  }
  b->ArgNames({"type", "rows", "cols", "tokens", "threads", "cached"});
  b->Unit(benchmark::kMicrosecond);
  b->UseRealTime();
  b->ComputeStatistics("min", MinOf);
}

BENCHMARK(BM_MatMul)->Name("Decode")->Apply([](auto* b) { MatMulArgs(b, 1); });
BENCHMARK(BM_MatMul)->Name("Prefill")->Apply([](auto* b) { MatMulArgs(b, 128); });
BENCHMARK(BM_MatMul)->Name("DecodeBatch")->Apply([](auto* b) {
  for (int64_t cached : {0, 1}) {
    for (int64_t threads : {1, 2}) {
      for (int64_t n_tokens : {1, 2, 4, 8}) {
        b->Args({static_cast<int64_t>(TensorType::kQ4_0), 5632, 2048, n_tokens, threads, cached});
      }
    }
  }
  b->ArgNames({"type", "rows", "cols", "tokens", "threads", "cached"});
  b->Unit(benchmark::kMicrosecond);
  b->UseRealTime();
  b->ComputeStatistics("min", MinOf);
});
BENCHMARK(BM_MatMul)->Name("KQuants")->Apply([](auto* b) {
  for (TensorType type : {TensorType::kQ4_1, TensorType::kQ5_0, TensorType::kQ5_1, TensorType::kQ2_K,
                          TensorType::kQ3_K}) {
    for (int64_t n_tokens : {1, 128}) {
      b->Args({static_cast<int64_t>(type), 5632, 2048, n_tokens, 1, 0});
    }
  }
  b->ArgNames({"type", "rows", "cols", "tokens", "threads", "cached"});
  b->Unit(benchmark::kMicrosecond);
  b->UseRealTime();
  b->ComputeStatistics("min", MinOf);
});
// Kernel speed without DRAM: 256 rows stay in L2, one thread.
BENCHMARK(BM_MatMul)->Name("DecodeCached")->Apply([](auto* b) {
  for (TensorType type : {TensorType::kQ4_0, TensorType::kQ8_0, TensorType::kF16}) {
    b->Args({static_cast<int64_t>(type), 256, 2048, 1, 1, 1});
  }
  b->ArgNames({"type", "rows", "cols", "tokens", "threads", "cached"});
  b->Unit(benchmark::kMicrosecond);
  b->ComputeStatistics("min", MinOf);
});

}  // namespace
}  // namespace kvasir

int main(int argc, char** argv) {
  // KVASIR_SIMD_TARGET=AVX2 (or any name SimdTargetName can report) measures a lower target.
  if (const char* want = std::getenv("KVASIR_SIMD_TARGET"); want != nullptr && *want != '\0') {
    bool found = false;
    for (int64_t t : kvasir::kernels_internal::AvailableSimdTargets()) {
      if (kvasir::kernels_internal::SimdTargetNameOf(t) == want) {
        kvasir::kernels_internal::ForceSimdTarget(t);
        found = true;
      }
    }
    if (!found) {
      std::fprintf(stderr, "KVASIR_SIMD_TARGET=%s: not available on this CPU\n", want);
      return 1;
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("simd_target", kvasir::SimdTargetName());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
