#include "ring/test_fault.h"

#include <cmath>
#include <random>

namespace kvasir::ring {

bool TestFaultsBuilt() {
#if defined(KVASIR_TEST_FAULTS) && KVASIR_TEST_FAULTS
  return true;
#else
  return false;
#endif
}

Status CheckTestFaultNoise(double p) {
  if (!(p >= 0 && p <= 1)) {
    return Error("--test-fault-noise: {} is not a probability from 0 to 1", p);
  }
  if (p > 0 && !TestFaultsBuilt()) {
    return Error(
        "--test-fault-noise: this build has no test faults (they are for tests of the audits; "
        "configure with -DKVASIR_BUILD_TESTS=ON)");
  }
  return Status::Ok();
}

void AddTestFaultNoise(std::span<float> rows, size_t n_embd, double p) {
  if (!(p > 0) || n_embd == 0 || !TestFaultsBuilt()) return;
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_real_distribution<double> unit(0, 1);
  for (size_t r = 0; r + n_embd <= rows.size(); r += n_embd) {
    if (unit(rng) >= p) continue;
    const std::span<float> row = rows.subspan(r, n_embd);
    double sum = 0;
    for (float v : row) sum += static_cast<double>(v) * v;
    const double amp = 0.25 * std::sqrt(sum / static_cast<double>(n_embd));
    for (float& v : row) v += static_cast<float>(amp * (2 * unit(rng) - 1));
  }
}

}  // namespace kvasir::ring
