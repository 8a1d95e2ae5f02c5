#include "spec/draft_budget.h"

#include <algorithm>
#include <cmath>

namespace kvasir::spec {
namespace {

constexpr double kWeight = 0.3;       // of the newest step in the running acceptance
constexpr double kPauseBelow = 0.15;  // acceptance under which drafting pauses
constexpr int kMaxPause = 64;

}  // namespace

DraftBudget::DraftBudget(int max_tokens, bool adaptive)
    : max_tokens_(std::max(0, max_tokens)), adaptive_(adaptive) {}

int DraftBudget::Next() {
  if (max_tokens_ == 0 || !adaptive_) return max_tokens_;
  if (paused_for_ > 0) {
    --paused_for_;
    return 0;
  }
  if (acceptance_ < kPauseBelow) return 1;  // a probe after a pause
  // A run of drafts is accepted for a / (1 - a) tokens on average: draft about one more.
  const double run = acceptance_ / std::max(1e-6, 1.0 - acceptance_);
  return static_cast<int>(std::clamp(std::round(run) + 1.0, 1.0, static_cast<double>(max_tokens_)));
}

void DraftBudget::Record(int drafted, int accepted) {
  if (drafted <= 0) return;
  const double rate = static_cast<double>(std::clamp(accepted, 0, drafted)) / drafted;
  acceptance_ = (1.0 - kWeight) * acceptance_ + kWeight * rate;
  if (acceptance_ < kPauseBelow) {
    paused_for_ = next_pause_;
    next_pause_ = std::min(2 * next_pause_, kMaxPause);
  } else {
    next_pause_ = 4;
  }
}

}  // namespace kvasir::spec
