// `kvasir --backend cuda` on whatever machine runs the tests: without the CUDA backend built in it
// says so; built in but without a device or driver (the CI machines) it says "no CUDA device:
// <why>"; both exit 1 without a crash. With a device it generates the CPU's greedy text.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "backend/registry.h"
#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using ::testing::HasSubstr;
using testing::RunKvasir;
using testing::RunResult;

const BackendRegistration* CudaRegistration() {
  for (const BackendRegistration* r : BuiltBackends()) {
    if (std::string(r->name) == "cuda") return r;
  }
  return nullptr;
}

TEST(CudaCliTest, GenerateOnCudaRunsOrSaysWhyNotAndExitsOne) {
  const std::string kModel = "models/stories260K.gguf";
  KV_REQUIRE_ASSET(kModel);
  const std::vector<std::string> args = {"generate",
                                         "-m",
                                         testing::AssetPath(kModel),
                                         "-p",
                                         "Once upon a time",
                                         "-n",
                                         "16",
                                         "--temp",
                                         "0",
                                         "-t",
                                         "1"};
  std::vector<std::string> cuda = args;
  cuda.insert(cuda.end(), {"--backend", "cuda"});
  const RunResult r = RunKvasir(cuda);
  const BackendRegistration* reg = CudaRegistration();
  if (reg == nullptr) {
    EXPECT_EQ(r.code, 1) << testing::Describe(r);
    EXPECT_THAT(r.err, HasSubstr("backend cuda:0: this kvasir was built without it"));
    return;
  }
  auto devices = reg->devices();
  if (!devices.ok() || devices->empty()) {
    EXPECT_EQ(r.code, 1) << testing::Describe(r);
    EXPECT_THAT(r.err, HasSubstr("no CUDA device: "));
    EXPECT_EQ(r.out, "");
    return;
  }
  ASSERT_EQ(r.code, 0) << testing::Describe(r);
  const RunResult cpu = RunKvasir(args);
  ASSERT_EQ(cpu.code, 0) << testing::Describe(cpu);
  EXPECT_EQ(r.out, cpu.out);
}

TEST(CudaCliTest, DevicesListsCudaDevicesOrWhyThereAreNone) {
  const RunResult r = RunKvasir({"devices"});
  ASSERT_EQ(r.code, 0) << testing::Describe(r);
  const BackendRegistration* reg = CudaRegistration();
  if (reg == nullptr) {
    EXPECT_THAT(r.out, HasSubstr("cuda: not built into this kvasir"));
    return;
  }
  auto devices = reg->devices();
  if (!devices.ok()) {
    EXPECT_THAT(r.out, HasSubstr("cuda: no CUDA device: "));
    return;
  }
  for (const DeviceInfo& d : *devices) {
    EXPECT_THAT(r.out, HasSubstr(d.address));
    EXPECT_THAT(r.out, HasSubstr("q4_k"));
  }
}

}  // namespace
}  // namespace kvasir
