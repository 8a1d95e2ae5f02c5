#include "kernels/simd_target.h"

#include "hwy/highway.h"
#include "hwy/targets.h"

namespace kvasir::kernels_internal {

std::vector<int64_t> AvailableSimdTargets() {
  std::vector<int64_t> targets;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) targets.push_back(t);
  return targets;
}

void ForceSimdTarget(int64_t target) {
  hwy::SetSupportedTargetsForTest(target);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

std::string SimdTargetNameOf(int64_t target) { return hwy::TargetName(target); }

}  // namespace kvasir::kernels_internal
