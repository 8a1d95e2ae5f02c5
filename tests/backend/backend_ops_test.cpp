// The op-by-op test, as llama.cpp's test-backend-ops: every op of every backend this build has,
// on every device it finds, against a judge, on the random inputs and odd shapes of op_cases.cpp,
// within each op's stated tolerance. The judge of the CPU backend is the scalar reference backend
// (the reference kernels); the judge of any other backend is the CPU backend. A backend joins by
// its row in backend/registry.cpp: nothing here names one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "backend/op_cases.h"
#include "backend/reference_backend.h"
#include "backend/registry.h"

namespace kvasir::testing {
namespace {

// One backend device under test.
struct Target {
  std::string spec;  // "cpu", "opencl:0:0", ...
  int threads = 1;
  std::string skip;   // why it cannot be tested here (no device), or empty
  std::string label;  // for the test name
};

std::vector<Target> Targets() {
  std::vector<Target> out;
  for (const BackendRegistration* r : BuiltBackends()) {
    auto devices = r->devices();
    if (!devices.ok() || devices->empty()) {
      out.push_back({r->name, 1,
                     fmt::format("backend {}: no device here ({})", r->name,
                                 devices.ok() ? "none found" : devices.status().message()),
                     r->name});
      continue;
    }
    for (const DeviceInfo& d : *devices) {
      std::string label = d.address;
      for (char& c : label) c = c == ':' ? '_' : c;
      if (std::string(r->name) == "cpu") {
        // Twice: one thread, and three (other splits of every parallel loop).
        out.push_back({d.address, 1, "", label + "_t1"});
        out.push_back({d.address, 3, "", label + "_t3"});
      } else {
        out.push_back({d.address, 1, "", label});
      }
    }
  }
  return out;
}

// Compares what two backends wrote; empty when they agree within `max_nmse`. *nmse_out (when
// given) receives the measured error.
std::string Compare(const OpOutput& got, const OpOutput& want, double max_nmse,
                    double* nmse_out = nullptr) {
  if (got.values.size() != want.values.size()) {
    return fmt::format("{}: {} values, the judge wrote {}", got.what, got.values.size(),
                       want.values.size());
  }
  double err = 0, norm = 0;
  for (size_t i = 0; i < got.values.size(); ++i) {
    const float a = got.values[i], b = want.values[i];
    if (!std::isfinite(a) || !std::isfinite(b)) {
      return fmt::format("{}[{}]: {} against {} (unwritten or not finite)", got.what, i, a, b);
    }
    if (got.exact && std::memcmp(&a, &b, sizeof(a)) != 0) {
      return fmt::format("{}[{}]: {} against {}, must be equal", got.what, i, a, b);
    }
    err += (static_cast<double>(a) - b) * (static_cast<double>(a) - b);
    norm += static_cast<double>(b) * b;
  }
  const double nmse = norm > 0 ? err / norm : err;
  if (nmse_out != nullptr) *nmse_out = nmse;
  if (!(nmse <= max_nmse)) {
    return fmt::format("{}: normalised squared error {:.3g} above the tolerance {:.3g}", got.what,
                       nmse, max_nmse);
  }
  return "";
}

class OpTest : public ::testing::TestWithParam<std::tuple<Target, Op>> {};

TEST_P(OpTest, AgreesWithItsJudgeWithinTheOpTolerance) {
  const auto& [target, op] = GetParam();
  if (!target.skip.empty()) GTEST_SKIP() << target.skip;
  auto backend = OpenBackend(target.spec, BackendOptions{target.threads});
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  std::unique_ptr<Backend> judge;
  if (target.spec == "cpu") {
    judge = MakeReferenceBackend();
  } else {
    auto cpu = OpenBackend("cpu", BackendOptions{2});
    ASSERT_TRUE(cpu.ok()) << cpu.status().message();
    judge = std::move(cpu).value();
  }
  if (!(*backend)->SupportsOp(op)) GTEST_SKIP() << target.spec << " does not run " << OpName(op);
  int run = 0;
  double worst = 0;  // the largest error of any case, printed for docs/BACKENDS.md
  for (const OpCase& c : CasesOf(op)) {
    if (!(*backend)->SupportsType(c.type)) continue;  // refused at load, never run
    SCOPED_TRACE(c.name);
    const std::vector<OpOutput> got = c.run(**backend);
    const std::vector<OpOutput> want = c.run(*judge);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      double nmse = 0;
      const std::string diff = Compare(got[i], want[i], MaxError(op), &nmse);
      EXPECT_TRUE(diff.empty()) << target.spec << ": " << c.name << ": " << diff;
      worst = std::max(worst, nmse);
    }
    ++run;
  }
  std::printf("%s %s: %d cases, largest normalised squared error %.3g (tolerance %.3g)\n",
              target.spec.c_str(), OpName(op), run, worst, MaxError(op));
  RecordProperty("largest_error", fmt::format("{:.3g}", worst));
  EXPECT_GT(run, 0) << "no case of " << OpName(op) << " ran on " << target.spec;
}

std::vector<Op> AllOps() {
  std::vector<Op> ops;
  for (int i = 0; i < static_cast<int>(Op::kCount); ++i) ops.push_back(static_cast<Op>(i));
  return ops;
}

INSTANTIATE_TEST_SUITE_P(Backends, OpTest,
                         ::testing::Combine(::testing::ValuesIn(Targets()),
                                            ::testing::ValuesIn(AllOps())),
                         [](const auto& info) {
                           return std::get<0>(info.param).label + "_" +
                                  OpName(std::get<1>(info.param));
                         });

// Every op has cases, on odd shapes with 1 and 37 tokens, and a tolerance.
TEST(OpCasesTest, EveryOpHasCasesAndATolerance) {
  for (Op op : AllOps()) {
    SCOPED_TRACE(OpName(op));
    EXPECT_FALSE(CasesOf(op).empty());
    EXPECT_GE(MaxError(op), 0.0);
  }
}

// The weight ops cover every type the kernels run.
TEST(OpCasesTest, WeightOpsCoverEveryKernelType) {
  for (Op op : {Op::kGetRows, Op::kMatMul, Op::kMoeFfn}) {
    std::set<TensorType> types;
    for (const OpCase& c : CasesOf(op)) types.insert(c.type);
    for (uint32_t id = 0; id < 64; ++id) {
      const auto t = static_cast<TensorType>(id);
      if (KernelsSupport(t)) {
        EXPECT_EQ(types.count(t), 1u) << OpName(op) << " " << id;
      }
    }
  }
}

// The judge catches an op that writes the wrong thing: the reference backend against a backend
// whose output differs beyond the tolerance fails the comparison.
TEST(OpCasesTest, AComparisonFailsOutsideTheTolerance) {
  const OpOutput want{"y", {1.0f, 2.0f, 3.0f}, false};
  OpOutput got = want;
  EXPECT_EQ(Compare(got, want, 0.0), "");
  got.values[1] = 2.01f;  // normalised squared error 7e-6
  EXPECT_EQ(Compare(got, want, 1e-5), "");
  EXPECT_NE(Compare(got, want, 1e-6), "");
  got.values[1] = std::nanf("");
  EXPECT_NE(Compare(got, want, 1.0), "");
  OpOutput exact{"ids", {1.0f, 2.0f}, true};
  OpOutput other = exact;
  other.values[0] = 1.0000001f;
  EXPECT_NE(Compare(other, exact, 1.0), "");
}

}  // namespace
}  // namespace kvasir::testing
