// The fixture of the fetch tests: a synthetic 4-layer model (and stories260K, when present)
// served by nginx from a private directory, and helpers to compare fetched and local slices.
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/sha256.h"
#include "fake_http_server.h"
#include "gguf/gguf_file.h"
#include "kvasir_process.h"
#include "model/model_id.h"
#include "nginx_fixture.h"
#include "ring_test_util.h"
#include "shard/fetch.h"
#include "shard/slice.h"
#include "test_assets.h"
#include "tiny_model.h"

namespace kvasir {
namespace fetch_testing {
// Unnamed: each test file that includes this gets its own copy.
namespace {

using testing::AssetPath;
using ::testing::HasSubstr;
using testing::Nginx;
using testing::ReadFileToString;
using testing::TempDir;

constexpr const char* kStories = "models/stories260K.gguf";

// What a test directory holds besides `keep`: a failed fetch must leave nothing (no output, no
// .part, no .part.state).
[[maybe_unused]] std::vector<std::string> Leftovers(const TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

[[maybe_unused]] std::string SliceBytes(const std::string& model, int first, int last,
                                        const TempDir& dir) {
  auto parent = GgufFile::Open(model);
  EXPECT_TRUE(parent.ok()) << parent.status().message();
  const std::string path = dir.File(fmt::format("ref-{}-{}.gguf", first, last));
  Status s = WriteSlice(*parent, first, last, path, nullptr);
  EXPECT_TRUE(s.ok()) << s.message();
  std::string bytes = ReadFileToString(path);
  std::filesystem::remove(path);
  return bytes;
}

// Bytes done as FetchOptions::progress reports them, for a test to wait on (the fetch runs on
// another thread).
class ProgressWaiter {
 public:
  // Installs itself as `o`'s progress callback; `o` must not outlive the waiter.
  void Attach(FetchOptions& o) {
    o.progress = [this](const FetchProgress& p) {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = p.done_bytes;
      cv_.notify_all();
    };
  }
  // Waits until at least `bytes` are done, for at most `seconds`; whether they were.
  bool WaitFor(uint64_t bytes, int seconds = 20) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(seconds), [&] { return done_ >= bytes; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t done_ = 0;
};

[[maybe_unused]] FetchOptions Options(const std::string& url, int first, int last,
                                      const std::string& out) {
  FetchOptions o;
  o.url = url;
  o.first = first;
  o.last = last;
  o.out_path = out;
  o.http.connect_timeout_ms = 3000;
  o.http.request_timeout_ms = 3000;
  o.retry.delay_ms = 20;
  o.retry.retries = 2;
  return o;
}

[[maybe_unused]] std::string Ratio(const FetchSummary& s) {
  return fmt::format(
      "{} tensors, {} of {} bytes ({:.2f}%), downloaded {} bytes in {} requests", s.n_tensors,
      s.window_bytes, s.file_bytes,
      100.0 * static_cast<double>(s.window_bytes) / static_cast<double>(s.file_bytes),
      s.downloaded_bytes, s.requests);
}

class FetchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    served_ = new TempDir();
    // 4 layers of 512-wide f32 matrices: about 10 MiB a layer, enough for transfers to take time.
    testing::TinyModelShape shape;
    shape.n_layer = 4;
    shape.n_embd = 512;
    shape.n_head = 8;
    shape.n_head_kv = 4;
    shape.n_ff = 1024;
    shape.n_vocab = 256;
    Status s = testing::WriteTinyModel(served_->File("synth.gguf"), shape);
    ASSERT_TRUE(s.ok()) << s.message();
    if (std::filesystem::exists(AssetPath(kStories))) {
      std::filesystem::create_symlink(std::filesystem::absolute(AssetPath(kStories)),
                                      served_->File("stories260K.gguf"));
    }
  }
  static void TearDownTestSuite() {
    delete served_;
    served_ = nullptr;
  }
  static std::string Served(const std::string& name) { return served_->File(name); }
  static Nginx::Options NginxOptions() {
    Nginx::Options o;
    o.root = served_->path();
    o.slow_rate = "2m";
    return o;
  }

  inline static TempDir* served_ = nullptr;
  TempDir out_;
};

using CliRun = testing::RunResult;

// Runs `kvasir ARGS` with KVASIR_CACHE_DIR=cache_dir.
[[maybe_unused]] CliRun Kvasir(const std::vector<std::string>& args, const std::string& cache_dir) {
  return testing::RunKvasir(args, {{"KVASIR_CACHE_DIR", cache_dir}});
}

}  // namespace
}  // namespace fetch_testing
}  // namespace kvasir
