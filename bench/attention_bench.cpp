// CPU attention (backend/cpu/cpu_attention.h) on the bench model's shape (32 query heads, 4 KV
// heads of 64): a chat's cached second turn (57 rows after 1,627 cached positions), one decode
// step at that depth, and a short prompt (57 rows from position 0), one thread. PerPair is the
// kernel it replaced, kept here as the baseline: one dot product per (row, head, key) with a
// horizontal sum each, and the output row loaded and stored once per key.
//
//   build/bin/attention_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_attention.h"
#include "base/thread_pool.h"
#include "kernels/attention_bf16.h"
#include "kernels/kernels.h"

namespace kvasir {
namespace {

constexpr int kHeads = 32, kKvHeads = 4, kHeadDim = 64;

struct Inputs {
  std::vector<float> q, k, v, out;
  AttentionParams p{kHeads, kKvHeads, kHeadDim, 0.125f, 0, 0};
  Inputs(int n, int pos0) {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    auto fill = [&](std::vector<float>& x, size_t size) {
      x.resize(size);
      for (float& e : x) e = d(rng);
    };
    fill(q, size_t(n) * kHeads * kHeadDim);
    fill(k, size_t(pos0 + n) * kKvHeads * kHeadDim);
    fill(v, size_t(pos0 + n) * kKvHeads * kHeadDim);
    out.resize(q.size());
  }
};

void PerPair(const Inputs& in, int n, int pos0, float* out) {
  const int group = kHeads / kKvHeads;
  std::vector<float> scores;
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < kHeads; ++h) {
      const int n_kv = pos0 + t + 1;
      const float* qh = in.q.data() + (size_t(t) * kHeads + h) * kHeadDim;
      const float* kh = in.k.data() + (h / group) * kHeadDim;
      const float* vh = in.v.data() + (h / group) * kHeadDim;
      scores.resize(n_kv);
      for (int j = 0; j < n_kv; ++j) {
        scores[j] = DotF32(qh, kh + size_t(j) * kKvHeads * kHeadDim, kHeadDim) * in.p.scale;
      }
      Softmax(scores.data(), n_kv);
      float* oh = out + (size_t(t) * kHeads + h) * kHeadDim;
      for (int d = 0; d < kHeadDim; ++d) oh[d] = 0.0f;
      for (int j = 0; j < n_kv; ++j) {
        Axpy(scores[j], vh + size_t(j) * kKvHeads * kHeadDim, kHeadDim, oh);
      }
    }
  }
}

void BM_Attention(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0)), pos0 = static_cast<int>(state.range(1));
  const int kind = static_cast<int>(state.range(2));  // 0 packed keys, 1 per pair, 2 bf16
  if (kind == 2 && !HaveBf16Attention()) {
    state.SkipWithError("this CPU has no AVX512-BF16");
    return;
  }
  Inputs in(n, pos0);
  ThreadPool pool(1);
  for (auto _ : state) {
    if (kind == 1) {
      PerPair(in, n, pos0, in.out.data());
    } else if (kind == 2) {
      cpu::CpuAttentionBf16(in.q.data(), n, pos0, in.k.data(), in.v.data(), in.p, in.out.data(),
                            pool);
    } else {
      cpu::CpuAttention(in.q.data(), n, pos0, in.k.data(), in.v.data(), in.p, in.out.data(), pool);
    }
    benchmark::DoNotOptimize(in.out.data());
  }
  // Multiply-adds of q.k and of the weighted values, over the keys each row sees.
  const double macs = 2.0 * kHeads * kHeadDim * (double(n) * pos0 + double(n) * (n + 1) / 2);
  state.counters["GMAC/s"] =
      benchmark::Counter(macs * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(kind == 1   ? "per-pair baseline"
                 : kind == 2 ? "bf16 (--attn-type bf16)"
                             : "packed keys");
}

// {rows, first position, 0 packed keys / 1 per-pair baseline / 2 bf16}
BENCHMARK(BM_Attention)
    ->Args({57, 1627, 0})
    ->Args({57, 1627, 1})
    ->Args({57, 1627, 2})
    ->Args({1, 1627, 0})
    ->Args({1, 1627, 1})
    ->Args({1, 1627, 2})
    ->Args({57, 0, 0})
    ->Args({57, 0, 1})
    ->Args({57, 0, 2})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvasir

BENCHMARK_MAIN();
