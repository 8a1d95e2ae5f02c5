// Test and benchmark support: which Highway target the kernels dispatch to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvasir::kernels_internal {

// Highway targets compiled into the kernels that this CPU supports, best first.
std::vector<int64_t> AvailableSimdTargets();
// Makes every kernel dispatch to `target` (one of AvailableSimdTargets()); 0 restores the best.
// Not thread-safe: call while no kernel runs.
void ForceSimdTarget(int64_t target);
// "AVX3_DL", "AVX2", "EMU128", ...
std::string SimdTargetNameOf(int64_t target);

}  // namespace kvasir::kernels_internal
