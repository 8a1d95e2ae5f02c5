// Choosing a backend: the --backend syntax, the refusal of a backend this build lacks, and the
// device listing behind `kvasir devices`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "backend/registry.h"
#include "model/layer_window.h"
#include "model/tiny_model.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using ::testing::HasSubstr;

std::set<std::string> Built() {
  std::set<std::string> names;
  for (const BackendRegistration* r : BuiltBackends()) names.insert(r->name);
  return names;
}

TEST(BackendSpecTest, EveryBackendTakesItsDeviceNumbersOrDefaultsToTheFirstDevice) {
  struct Case {
    const char* text;
    const char* name;
    std::vector<int> index;
  };
  for (const Case& c : {Case{"cpu", "cpu", {}}, Case{"opencl", "opencl", {0, 0}},
                        Case{"opencl:1:2", "opencl", {1, 2}}, Case{"cuda", "cuda", {0}},
                        Case{"cuda:3", "cuda", {3}}, Case{"cuda:999", "cuda", {999}}}) {
    auto spec = ParseBackendSpec(c.text);
    ASSERT_TRUE(spec.ok()) << c.text << ": " << spec.status().message();
    EXPECT_EQ(spec->name, c.name);
    EXPECT_EQ(spec->index, c.index) << c.text;
  }
  EXPECT_EQ(ParseBackendSpec("opencl")->ToString(), "opencl:0:0");
  EXPECT_EQ(ParseBackendSpec("cpu")->ToString(), "cpu");
}

TEST(BackendSpecTest, MalformedSpecsAreRefusedQuotingTheTextAndTheSyntax) {
  for (const char* text : {"", "gpu", "CPU", "cpu:0", "opencl:1", "opencl:1:2:3",
                           "opencl::", "cuda:", "cuda:x", "cuda:1000", "cuda:-1", "cuda:1:2"}) {
    auto spec = ParseBackendSpec(text);
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_THAT(spec.status().message(), HasSubstr(std::string("'") + text + "'"));
  }
  EXPECT_THAT(ParseBackendSpec("tpu").status().message(),
              HasSubstr("cpu, opencl[:PLATFORM:DEVICE], cuda[:N]"));
  EXPECT_THAT(ParseBackendSpec("opencl:1").status().message(),
              HasSubstr("opencl[:PLATFORM:DEVICE]"));
}

TEST(BackendRegistryTest, TheCpuBackendIsAlwaysBuiltAndListedFirst) {
  const auto built = BuiltBackends();
  ASSERT_FALSE(built.empty());
  EXPECT_STREQ(built.front()->name, "cpu");
  EXPECT_TRUE(CheckBackendBuilt(*ParseBackendSpec("cpu")).ok());
}

TEST(BackendRegistryTest, ABackendNotBuiltIsRefusedNamingTheBuiltOnesAndHowToBuildIt) {
  int refused = 0;
  for (const char* name : {"opencl", "cuda"}) {
    if (Built().count(name) != 0) continue;
    auto be = OpenBackend(name, BackendOptions{});
    ASSERT_FALSE(be.ok()) << name;
    EXPECT_THAT(be.status().message(), HasSubstr("built without it (built: cpu"));
    EXPECT_THAT(be.status().message(),
                HasSubstr(std::string("-DKVASIR_") + (name[0] == 'o' ? "OPENCL" : "CUDA") + "=ON"));
    ++refused;
  }
  if (refused == 0) GTEST_SKIP() << "every backend is built into this binary";
}

// A window whose backend cannot be opened (not built in, or built but without that device) is
// refused when it loads, naming the backend.
TEST(BackendRegistryTest, AWindowOnABackendItCannotOpenIsRefusedAtLoad) {
  testing::TempDir dir;
  const std::string path = dir.File("tiny.gguf");
  ASSERT_TRUE(testing::WriteTinyModel(path, {}).ok());
  WindowOptions o;
  std::vector<std::string> want;
  if (Built().count("opencl") == 0) {
    o.backend = "opencl:0:1";
    want = {"backend opencl:0:1: this kvasir was built without"};
  } else {
    o.backend = "opencl:0:999";  // no machine has a thousand devices on a platform
    want = {"opencl:0:999: platform 0 has", "opencl:0:999: there is no platform 0",
            "no OpenCL platform on this machine"};
  }
  auto w = LayerWindow::Load(testing::OpenShared(path), {0, 2, true, true}, o);
  ASSERT_FALSE(w.ok());
  const std::string& msg = w.status().message();
  EXPECT_TRUE(std::any_of(want.begin(), want.end(), [&](const std::string& s) {
    return msg.find(s) != std::string::npos;
  })) << msg;
}

TEST(BackendRegistryTest, DevicesListEveryKnownBackendAndTheCpuWithItsTypesAndMemory) {
  const std::vector<BackendDevices> all = ListAllDevices();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].backend, "cpu");
  ASSERT_TRUE(all[0].built);
  ASSERT_TRUE(all[0].status.ok()) << all[0].status.message();
  ASSERT_EQ(all[0].devices.size(), 1u);
  const DeviceInfo& cpu = all[0].devices[0];
  EXPECT_EQ(cpu.address, "cpu");
  EXPECT_FALSE(cpu.name.empty());
  EXPECT_GT(cpu.memory_bytes, 0u);
  EXPECT_THAT(TypeList(cpu.types), HasSubstr("q4_k"));
  for (size_t i = 1; i < all.size(); ++i) {
    if (!all[i].built) {
      EXPECT_THAT(all[i].status.message(), HasSubstr("not built"));
    }
  }
}

}  // namespace
}  // namespace kvasir
