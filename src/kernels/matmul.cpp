// MatMul: checks, activation quantization and the split of rows over the thread pool. The
// arithmetic lives in the per-target kernels (matmul_quant.cpp, matmul_float.cpp and the x86
// kernels of matmul_x86.h).
#include <algorithm>
#include <atomic>
#include <vector>

#include "base/check.h"
#include "kernels/kernels.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant_ints.h"

namespace kvasir {
namespace {

using kernels_internal::kQBlock;

// Grows-only storage for the quantized activations of the calling thread: no allocation once the
// largest batch has been seen.
struct ActBuffers {
  std::vector<int8_t> qs;
  std::vector<float> d;
  std::vector<int32_t> corr;
  std::vector<int32_t> sum;
  std::vector<int32_t> sum_lo;
  std::vector<float> fsum;
};

thread_local ActBuffers t_acts;

// Rows per chunk: whole 16-row groups, enough weights per chunk (about 64K values) that handing
// small matrices to other threads does not cost more than it saves, and about four chunks per
// thread so that a thread the OS delays does not hold the others up.
int64_t RowChunk(int64_t rows, int64_t cols, int n_threads) {
  constexpr int64_t kMinValuesPerChunk = 64 * 1024;
  const int64_t min_rows = (kMinValuesPerChunk + cols - 1) / std::max<int64_t>(cols, 1);
  const int64_t balanced = (rows + 4 * n_threads - 1) / (4 * n_threads);
  return (std::max(min_rows, balanced) + 15) / 16 * 16;
}

// Calls fn(begin, end) on contiguous row chunks; threads take the next chunk as they finish.
// Every row's result is independent of the chunking, so the split does not change the output.
template <typename Fn>
void ForRowChunks(ThreadPool& pool, int64_t rows, int64_t cols, Fn&& fn) {
  const int64_t chunk = RowChunk(rows, cols, pool.size());
  const int64_t n_chunks = (rows + chunk - 1) / chunk;
  if (pool.size() == 1 || n_chunks <= 1) {
    fn(int64_t{0}, rows);
    return;
  }
  std::atomic<int64_t> next{0};
  pool.Run([&](int, int) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < n_chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(c * chunk, std::min(rows, (c + 1) * chunk));
    }
  });
}

}  // namespace

void MatMul(const MatrixView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  KV_CHECK(KernelsSupport(w.type), "MatMul: weight type {} not supported (supported: {})",
           static_cast<uint32_t>(w.type), SupportedTypesList());
  KV_CHECK(n_tokens >= 0 && w.rows >= 0 && w.cols >= 0, "MatMul: negative shape");
  if (n_tokens == 0 || w.rows == 0) return;
  KV_CHECK(w.row_bytes >= RowBytes(w.type, w.cols), "MatMul: row stride {} < row size {}",
           w.row_bytes, RowBytes(w.type, w.cols));
  if (kernels_internal::IsQuantizedType(w.type)) {
    const int64_t nb = w.cols / kQBlock;
    ActBuffers& buf = t_acts;
    const auto need = static_cast<size_t>(n_tokens * nb);
    if (buf.d.size() < need) {
      buf.qs.resize(need * kQBlock);
      buf.d.resize(need);
      buf.corr.resize(need);
      buf.sum.resize(need);
      buf.sum_lo.resize(need);
      buf.fsum.resize(need);
    }
    const kernels_internal::QuantActs acts{n_tokens,          w.cols,
                                           buf.qs.data(),     buf.d.data(),
                                           buf.corr.data(),   buf.sum.data(),
                                           buf.sum_lo.data(), buf.fsum.data()};
    const int32_t bias = kernels_internal::UnsignedWeightBias(w.type);
    pool.ParallelFor(kernels_internal::ActTiles(n_tokens), 1, [&](int64_t begin, int64_t end) {
      kernels_internal::QuantizeActs(x, bias, acts, begin, end);
    });
    ForRowChunks(pool, w.rows, w.cols, [&](int64_t begin, int64_t end) {
      kernels_internal::MatMulQuantRows(w, acts, y, begin, end);
    });
    return;
  }
  ForRowChunks(pool, w.rows, w.cols, [&](int64_t begin, int64_t end) {
    kernels_internal::MatMulFloatRows(w, x, n_tokens, y, begin, end);
  });
}

}  // namespace kvasir
