// How CpuAttention and CpuAttentionBf16 cut one call's work for the pool: units of (a KV head, up
// to kTokensPerUnit query tokens, a share of the head's query group). Decode has one token, so a
// group's heads are split until every thread has a unit.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kvasir::cpu {

// Query tokens per unit of work: enough rows to reuse each packed key block a few times while
// keeping a unit's scores in cache.
inline constexpr int kTokensPerUnit = 4;
// Query heads per unit at most (a group wider than this is split).
inline constexpr int kMaxHeadsPerUnit = 16;

struct AttentionUnit {
  int kv_head = 0;
  int t0 = 0, t1 = 0;  // query tokens [t0, t1)
  int h0 = 0, h1 = 0;  // query heads [h0, h1), all of KV head kv_head's group
};

class AttentionUnits {
 public:
  AttentionUnits(int n_head_kv, int group, int n_tokens, int n_threads)
      : group_(group),
        n_tokens_(n_tokens),
        token_units_((n_tokens + kTokensPerUnit - 1) / kTokensPerUnit),
        head_split_((group + kMaxHeadsPerUnit - 1) / kMaxHeadsPerUnit) {
    while (head_split_ < group && n_head_kv * token_units_ * head_split_ < n_threads) ++head_split_;
    size_ = int64_t{n_head_kv} * token_units_ * head_split_;
  }
  int64_t size() const { return size_; }
  AttentionUnit operator[](int64_t unit) const {
    const int64_t per_head = int64_t{token_units_} * head_split_;
    const int rest = static_cast<int>(unit % per_head);
    const int share = rest % head_split_;
    AttentionUnit u;
    u.kv_head = static_cast<int>(unit / per_head);
    u.t0 = (rest / head_split_) * kTokensPerUnit;
    u.t1 = std::min(n_tokens_, u.t0 + kTokensPerUnit);
    u.h0 = u.kv_head * group_ + group_ * share / head_split_;
    u.h1 = u.kv_head * group_ + group_ * (share + 1) / head_split_;
    return u;
  }

 private:
  int group_, n_tokens_, token_units_, head_split_;
  int64_t size_ = 0;
};

}  // namespace kvasir::cpu
