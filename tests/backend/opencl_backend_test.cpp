// What the OpenCL backend promises beyond the op-by-op test (backend_ops_test.cpp runs every op
// against the CPU): a device's memory is counted and a full one refused with the sizes named, a
// type it cannot run is refused naming the tensor, a kernel that fails to build is reported
// naming the device and the kernel, and a row's result does not depend on the batch it is in.
// Every test that needs a device skips, naming why, when this machine has none.
#include "backend/opencl/opencl_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "backend/op_cases.h"
#include "backend/opencl/cl_programs.h"
#include "backend/opencl/kernel_sources.h"
#include "kernels/kernels_test_util.h"

namespace kvasir::testing {
namespace {

using ::testing::HasSubstr;

// Sets an environment variable for the scope of a test, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Why this machine cannot run the OpenCL tests, or "".
std::string NoDevice() {
  auto devices = opencl::Registration()->devices();
  if (!devices.ok()) return "no OpenCL device: " + devices.status().message();
  if (devices->empty()) return "no OpenCL device: the platforms list none";
  return "";
}

#define KV_REQUIRE_OPENCL_DEVICE()                        \
  if (const std::string why = NoDevice(); !why.empty()) { \
    GTEST_SKIP() << why;                                  \
  }

std::unique_ptr<Backend> OpenCl() {
  auto be = OpenBackend("opencl", BackendOptions{1});
  EXPECT_TRUE(be.ok()) << be.status().message();
  return be.ok() ? std::move(be).value() : nullptr;
}

// The 1-based line of `needle` in `text`.
int LineOf(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  if (at == std::string::npos) return 0;
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + at, '\n'));
}

TEST(OpenClProgramsTest, ABuildLogsFirstErrorNamesTheKernelItIsInAndItsFileLine) {
  std::optional<opencl::ProgramSource> rows;
  for (const opencl::ProgramSource& p : opencl::BackendPrograms()) {
    if (p.name == "rows.cl") rows = p;
  }
  ASSERT_TRUE(rows.has_value());
  const int head = LineOf(rows->text, "__kernel void rms_norm(");
  int file_head = 0;
  for (const opencl::KernelSource& s : opencl::KernelSources()) {
    if (std::string(s.name) == "rows.cl") file_head = LineOf(s.text, "__kernel void rms_norm(");
  }
  ASSERT_GT(head, 0);
  ASSERT_GT(file_head, 0);
  const std::string log = "<source>:" + std::to_string(head + 4) +
                          ":7: warning: unused\n<source>:" + std::to_string(head + 5) +
                          ":3: error: use of undeclared identifier 'x'\n";
  EXPECT_EQ(opencl::KernelAtLogError(*rows, log),
            "rms_norm (rows.cl, line " + std::to_string(file_head + 5) + ")");
  // PoCL's form: "error: FILE:LINE:COL: ...".
  EXPECT_EQ(opencl::KernelAtLogError(*rows, "error: /tmp/x.cl:" + std::to_string(head + 2) +
                                                ":66: use of undeclared identifier\n"),
            "rms_norm (rows.cl, line " + std::to_string(file_head + 2) + ")");
  // A line of common.cl (before every kernel) or a log without a line names no kernel.
  EXPECT_EQ(opencl::KernelAtLogError(*rows, "<source>:3:1: error: x\n"), "");
  EXPECT_EQ(opencl::KernelAtLogError(*rows, "error: something went wrong\n"), "");
  EXPECT_EQ(opencl::KernelAtLogError(*rows, "<source>:999999:1: error: x\n"), "");
}

TEST(OpenClBackendTest, AKernelThatFailsToBuildNamesTheDeviceAndTheKernelWithoutAborting) {
  KV_REQUIRE_OPENCL_DEVICE();
  {
    ScopedEnv hook("KVASIR_OPENCL_BREAK_KERNEL", "attention");
    auto be = OpenBackend("opencl", BackendOptions{1});
    ASSERT_FALSE(be.ok());
    const std::string& msg = be.status().message();
    EXPECT_THAT(msg, HasSubstr("backend opencl:0:0 ("));
    EXPECT_THAT(msg, HasSubstr("kernel attention (attention.cl, line "));
    EXPECT_THAT(msg, HasSubstr("does not build"));
    EXPECT_THAT(msg, HasSubstr("kvasir_test_hook_breaks_this_kernel"));  // the build log
  }
  {
    ScopedEnv hook("KVASIR_OPENCL_BREAK_KERNEL", "no_such_kernel");
    auto be = OpenBackend("opencl", BackendOptions{1});
    ASSERT_FALSE(be.ok());
    EXPECT_THAT(be.status().message(), HasSubstr("'no_such_kernel', which is no kernel"));
  }
  // The failure left nothing behind: the backend opens.
  EXPECT_NE(OpenCl(), nullptr);
}

TEST(OpenClBackendTest, AllocationsPastTheLimitAreRefusedNamingTheSizes) {
  KV_REQUIRE_OPENCL_DEVICE();
  ScopedEnv limit("KVASIR_OPENCL_MEMORY_LIMIT", "1048576");
  auto be = OpenCl();
  ASSERT_NE(be, nullptr);
  EXPECT_EQ(be->device().memory_bytes, 1048576u);
  auto a = be->Alloc(196608, "first");  // 768 KiB
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = be->Alloc(131072, "a KV cache (keys)");  // 512 KiB: 256 KiB are left
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kTooLarge);
  EXPECT_THAT(b.status().message(),
              HasSubstr("cannot allocate 512.00 KiB for a KV cache (keys) (256.00 KiB free of "
                        "1.00 MiB)"));
  const TestMatrix w = MakeMatrix(TensorType::kQ8_0, 8192, 64, 1);  // 544 KiB
  auto m = be->UploadMatrix({"blk.0.ffn_up.weight", w.view, 1, w.bytes.size()});
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(),
              HasSubstr("cannot allocate 544.00 KiB for tensor blk.0.ffn_up.weight (256.00 KiB "
                        "free of 1.00 MiB)"));
  a->reset();  // given back: now it fits
  m = be->UploadMatrix({"blk.0.ffn_up.weight", w.view, 1, w.bytes.size()});
  EXPECT_TRUE(m.ok()) << m.status().message();
}

TEST(OpenClBackendTest, AMemoryLimitThatIsNoByteCountIsRefused) {
  KV_REQUIRE_OPENCL_DEVICE();
  ScopedEnv limit("KVASIR_OPENCL_MEMORY_LIMIT", "12x");
  auto be = OpenBackend("opencl", BackendOptions{1});
  ASSERT_FALSE(be.ok());
  EXPECT_THAT(be.status().message(), HasSubstr("KVASIR_OPENCL_MEMORY_LIMIT '12x'"));
}

TEST(OpenClBackendTest, ATypeItCannotRunIsRefusedNamingTensorTypeAndBackend) {
  KV_REQUIRE_OPENCL_DEVICE();
  auto be = OpenCl();
  ASSERT_NE(be, nullptr);
  for (TensorType t : kAllTypes) {
    const TestMatrix w = MakeMatrix(t, 3, IsQuantized(t) ? 256 : 64, 2);
    auto m = be->UploadMatrix({"blk.1.attn_k.weight", w.view, 1, w.bytes.size()});
    EXPECT_EQ(m.ok(), be->SupportsType(t)) << TensorTypeName(static_cast<uint32_t>(t));
    if (!m.ok()) {
      EXPECT_THAT(m.status().message(),
                  HasSubstr("tensor blk.1.attn_k.weight has type " +
                            TensorTypeName(static_cast<uint32_t>(t)) +
                            ", which backend opencl:0:0 cannot run (it runs: f32, f16, q8_0, "
                            "q4_0, q4_k, q5_k, q6_k)"));
    }
  }
}

TEST(OpenClBackendTest, ADeviceNumberPastTheMachinesIsRefusedNamingWhatItHas) {
  KV_REQUIRE_OPENCL_DEVICE();
  auto be = OpenBackend("opencl:0:99", BackendOptions{1});
  ASSERT_FALSE(be.ok());
  EXPECT_THAT(be.status().message(), HasSubstr("opencl:0:99: platform 0 has"));
  be = OpenBackend("opencl:99:0", BackendOptions{1});
  ASSERT_FALSE(be.ok());
  EXPECT_THAT(be.status().message(), HasSubstr("there is no platform 99"));
}

// On either decode path, the decode kernel (one row) and the prefill kernel (tiles of 8 rows) give
// a row the same bits, for quantized and float weights, and padded rows upload as packed ones.
TEST(OpenClBackendTest, ARowsProductDoesNotDependOnTheBatchOnEitherPath) {
  KV_REQUIRE_OPENCL_DEVICE();
  for (const char* path : {"rows", "split"}) {
    SCOPED_TRACE(path);
    ScopedEnv decode("KVASIR_OPENCL_DECODE", path);
    auto be = OpenCl();
    ASSERT_NE(be, nullptr);
    for (TensorType t :
         {TensorType::kF32, TensorType::kF16, TensorType::kQ4_0, TensorType::kQ6_K}) {
      SCOPED_TRACE(TensorTypeName(static_cast<uint32_t>(t)));
      const int64_t rows = 29, cols = IsQuantized(t) ? 512 : 67, n = 13;
      const TestMatrix w = MakeMatrix(t, rows, cols, 3, /*extra_row_bytes=*/6);
      auto m = be->UploadMatrix({"w", w.view, 1, w.bytes.size()});
      ASSERT_TRUE(m.ok()) << m.status().message();
      const std::vector<float> x = RandomFloats(n * cols, 4);
      auto xb = be->Alloc(n * cols, "x");
      auto yb = be->Alloc(n * rows, "y");
      ASSERT_TRUE(xb.ok() && yb.ok());
      const DevPtr xp{xb->get(), 0}, yp{yb->get(), 0};
      be->Upload(xp, x.data(), n * cols);
      be->MatMul(**m, xp, static_cast<int>(n), yp);
      std::vector<float> batch(n * rows), one(rows);
      ASSERT_TRUE(be->Download(batch.data(), yp, n * rows).ok());
      for (int64_t i = 0; i < n; ++i) {
        be->MatMul(**m, xp + i * cols, 1, yp);
        ASSERT_TRUE(be->Download(one.data(), yp, rows).ok());
        EXPECT_EQ(std::memcmp(one.data(), batch.data() + i * rows, rows * 4), 0) << "row " << i;
      }
    }
  }
}

// The split path (GPUs' decode) is verified here on whatever device the machine has: every
// mat_mul case of the op-by-op test against the CPU, within the op's tolerance.
TEST(OpenClBackendTest, TheSplitPathAgreesWithTheCpuWithinTheMatMulTolerance) {
  KV_REQUIRE_OPENCL_DEVICE();
  ScopedEnv decode("KVASIR_OPENCL_DECODE", "split");
  auto be = OpenCl();
  ASSERT_NE(be, nullptr);
  auto cpu = OpenBackend("cpu", BackendOptions{2});
  ASSERT_TRUE(cpu.ok());
  int run = 0;
  for (const OpCase& c : CasesOf(Op::kMatMul)) {
    if (!be->SupportsType(c.type)) continue;
    SCOPED_TRACE(c.name);
    const std::vector<OpOutput> got = c.run(*be), want = c.run(**cpu);
    ASSERT_EQ(got.size(), 1u);
    double err = 0, norm = 0;
    for (size_t i = 0; i < want[0].values.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[0].values[i])) << i;
      err += std::pow(double{got[0].values[i]} - want[0].values[i], 2);
      norm += std::pow(double{want[0].values[i]}, 2);
    }
    EXPECT_LE(err / norm, MaxError(Op::kMatMul));
    ++run;
  }
  EXPECT_EQ(run, 15);
}

TEST(OpenClBackendTest, ADecodePathThatIsNoneIsRefused) {
  KV_REQUIRE_OPENCL_DEVICE();
  ScopedEnv decode("KVASIR_OPENCL_DECODE", "fast");
  auto be = OpenBackend("opencl", BackendOptions{1});
  ASSERT_FALSE(be.ok());
  EXPECT_THAT(be.status().message(), HasSubstr("KVASIR_OPENCL_DECODE 'fast' is not rows or split"));
}

}  // namespace
}  // namespace kvasir::testing
