// The cases of the op-by-op test: for every op of backend/backend.h, random inputs on odd shapes
// (rows and columns that are multiples of no block or tile, 1 and 37 tokens), every weight type
// for the ops that take weights, and each op's tolerance. A case runs the same inputs on any
// backend and returns what the op wrote, so two backends can be compared.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace kvasir::testing {

// One tensor an op wrote, downloaded.
struct OpOutput {
  std::string what;
  std::vector<float> values;  // int32 outputs (expert ids) as their values
  bool exact = false;         // must be equal bit for bit (copies, ids)
};

struct OpCase {
  Op op;
  std::string name;                    // "mat_mul q4_k [67, 768] x 37 tokens"
  TensorType type = TensorType::kF32;  // the weights' type, for ops that take weights
  std::function<std::vector<OpOutput>(Backend&)> run;
};

// Every case of `op`.
std::vector<OpCase> CasesOf(Op op);

// The largest normalised mean squared error, sum (got - want)^2 / sum want^2, that an op's output
// may have against its judge (docs/BACKENDS.md lists them).
double MaxError(Op op);

}  // namespace kvasir::testing
