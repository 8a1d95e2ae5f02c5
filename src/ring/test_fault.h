// A fault for tests of the audits (docs/MARKET.md, "Recomputation"): a stage that perturbs the
// rows it sends on, as a stage that computes carelessly or cheaply would, while committing to and
// revealing exactly what it sent. Only builds with KVASIR_TEST_FAULTS (on in builds with the
// tests) accept it; any other build refuses the option.
#pragma once

#include <cstddef>
#include <span>

#include "base/status.h"

namespace kvasir::ring {

// Whether this build accepts test faults.
bool TestFaultsBuilt();

// Checks a stage's --test-fault-noise: a probability in [0, 1], and above 0 only in a build with
// test faults ("--test-fault-noise: this build has no test faults ...").
Status CheckTestFaultNoise(double p);

// Perturbs each row of `rows` ([n_rows, n_embd] f32) with probability `p`: every value of a chosen
// row gets uniform noise of up to a quarter of the row's RMS (about 0.14 of its L2 norm). Seeded
// from the system's entropy, per thread. Does nothing when p <= 0.
void AddTestFaultNoise(std::span<float> rows, size_t n_embd, double p);

}  // namespace kvasir::ring
