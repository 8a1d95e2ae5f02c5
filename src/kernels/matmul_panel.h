// Shared driver of the x86 integer kernels (matmul_vnni.cpp, matmul_avx2.cpp): rows are taken in
// groups of Kernel::kGroup, one row per 32-bit lane. Decode (small batches) streams each group
// once; prefill transposes a group into a thread-local panel and runs every activation tile
// against it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "base/check.h"
#include "kernels/matmul_internal.h"

namespace kvasir::kernels_internal {

// Grows-only 64-byte aligned scratch memory.
class ScratchBuffer {
 public:
  void* Get(size_t bytes) {
    if (bytes > size_) {
      ptr_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
      KV_CHECK(ptr_ != nullptr, "out of memory for {} bytes of kernel scratch", bytes);
      size_ = bytes;
    }
    return ptr_.get();
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> ptr_;
  size_t size_ = 0;
};

// One per thread: pool workers keep theirs between calls, so steady state allocates nothing.
inline ScratchBuffer& ThreadPanelScratch() {
  static thread_local ScratchBuffer buffer;
  return buffer;
}
inline ScratchBuffer& ThreadTailScratch() {
  static thread_local ScratchBuffer buffer;
  return buffer;
}

// kGroup rows of a weight matrix: row r, block b starts at base + r * row_bytes + b * block_bytes.
struct GroupSource {
  const uint8_t* base;
  size_t row_bytes;
  size_t block_bytes;
};

// Software prefetch of the next group's rows (one contiguous region) spread over the blocks of
// the current one: many short interleaved row streams defeat the hardware prefetcher. The lines
// go to L2 (locality 2), which keeps more misses in flight than L1; measured on Zen 4 this halved
// the single-thread Q8_0 decode time against prefetching into L1.
class GroupPrefetcher {
 public:
  GroupPrefetcher(const uint8_t* next, size_t region_bytes, int64_t nb)
      : next_(next), step_(next == nullptr ? 0 : (region_bytes + nb - 1) / nb) {}
  void Block(int64_t b) const {
    if (next_ == nullptr) return;
    const size_t end = (static_cast<size_t>(b) + 1) * step_;
    for (size_t off = static_cast<size_t>(b) * step_; off < end; off += 64) {
      __builtin_prefetch(next_ + off, 0, 2);
    }
  }

 private:
  const uint8_t* next_;
  size_t step_;
};

// Kernel provides:
//   static constexpr int kGroup;
//   static constexpr int kMaxDecodeTokens;  at most kActTile
//   struct Panel;  one transposed block of a group
//   template <bool kQ4> static void Decode(const GroupSource&, int64_t nb, const QuantActs&,
//                                          const GroupPrefetcher&, float* y, int64_t ld,
//                                          int64_t nr);
//   template <bool kQ4> static void Pack(const GroupSource&, int64_t nb, const GroupPrefetcher&,
//                                        Panel* panel);
//   template <bool kQ4> static void Tile(const Panel* panel, int64_t nb, const int8_t* qs,
//                                        const float* d, const int32_t* corr, int64_t nt,
//                                        float* y, int64_t ld, int64_t nr);
// Decode handles batches of up to kMaxDecodeTokens tokens (one activation tile) straight from the
// weights, which it reads once, and writes y[t * ld + i] for t < acts.n_tokens, i < nr; Tile
// writes y[t * ld + i] for t < nt, i < nr. The activation pointers of Tile are those of one
// QuantActs tile of nt tokens.
template <class Kernel, bool kQ4>
void RunPanelRows(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                  int64_t row_end) {
  constexpr int64_t kGroup = Kernel::kGroup;
  KV_CHECK(w.row_bytes * (kGroup - 1) < (size_t{1} << 31), "row stride {} too large for gather",
           w.row_bytes);
  const int64_t nb = w.cols / kQBlock;
  const size_t block_bytes = kQ4 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0);
  const auto* data = static_cast<const uint8_t*>(w.data);
  for (int64_t g0 = row_begin; g0 < row_end; g0 += kGroup) {
    const int64_t nr = std::min(kGroup, row_end - g0);
    GroupSource src{data + static_cast<size_t>(g0) * w.row_bytes, w.row_bytes, block_bytes};
    if (nr < kGroup) {
      // Tail group: copy its rows and zero-fill the rest so every lane reads valid memory.
      const size_t row_bytes = static_cast<size_t>(nb) * block_bytes;
      auto* rows = static_cast<uint8_t*>(ThreadTailScratch().Get(kGroup * row_bytes));
      std::memset(rows, 0, kGroup * row_bytes);
      for (int64_t r = 0; r < nr; ++r) {
        std::memcpy(rows + r * row_bytes, src.base + static_cast<size_t>(r) * w.row_bytes,
                    row_bytes);
      }
      src = GroupSource{rows, row_bytes, block_bytes};
    }
    const int64_t next_rows = std::min(kGroup, row_end - g0 - kGroup);
    const GroupPrefetcher prefetch(
        next_rows > 0 ? data + static_cast<size_t>(g0 + kGroup) * w.row_bytes : nullptr,
        static_cast<size_t>(std::max<int64_t>(next_rows, 0)) * w.row_bytes, nb);
    if (acts.n_tokens <= Kernel::kMaxDecodeTokens) {
      Kernel::template Decode<kQ4>(src, nb, acts, prefetch, y + g0, w.rows, nr);
      continue;
    }
    using Panel = typename Kernel::Panel;
    auto* panel =
        static_cast<Panel*>(ThreadPanelScratch().Get(static_cast<size_t>(nb) * sizeof(Panel)));
    Kernel::template Pack<kQ4>(src, nb, prefetch, panel);
    for (int64_t t0 = 0; t0 < acts.n_tokens; t0 += kActTile) {
      const int64_t nt = ActTileTokens(acts.n_tokens, t0);
      Kernel::template Tile<kQ4>(panel, nb, acts.qs + t0 * acts.cols, acts.d + t0 * nb,
                                 acts.corr + t0 * nb, nt, y + t0 * w.rows + g0, w.rows, nr);
    }
  }
}

}  // namespace kvasir::kernels_internal
