// Access to the shared test assets (real models, vocabularies, reference outputs) in
// ${KVASIR_ASSETS:-<repo>/../shared}. A test that needs an asset skips with a message when it is
// absent, unless KVASIR_REQUIRE_ASSETS=1, which turns the skip into a failure.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kvasir::testing {

inline std::string AssetsDir() {
  if (const char* env = std::getenv("KVASIR_ASSETS"); env != nullptr && *env != '\0') return env;
  return std::string(KVASIR_SOURCE_DIR) + "/../shared";
}

inline std::string AssetPath(const std::string& rel) { return AssetsDir() + "/" + rel; }

inline bool AssetsRequired() {
  const char* env = std::getenv("KVASIR_REQUIRE_ASSETS");
  return env != nullptr && std::string(env) == "1";
}

inline std::string ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvasir-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes a self-signed P-256 certificate (`cert`) and its key (`key`), PEM, valid for two days, for
// `alt_names` (e.g. "IP:127.0.0.1" or "IP:127.0.0.1,DNS:localhost"), with the openssl command.
// Returns "" on success, else why not (openssl's own words included).
inline std::string MakeTestCertificate(const std::string& cert, const std::string& key,
                                       const std::string& alt_names) {
  const std::string log = key + ".openssl.log";
  const std::string cmd =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
      "-subj /CN=127.0.0.1 -addext subjectAltName=" +
      alt_names + " -keyout " + key + " -out " + cert + " >" + log + " 2>&1";
  if (std::system(cmd.c_str()) == 0) return "";
  return "openssl cannot make a test certificate: " + ReadFileToString(log);
}

}  // namespace kvasir::testing

// Skips the test with `why`, or fails it under KVASIR_REQUIRE_ASSETS=1 (CI), where everything a
// test needs must be there: a missing tool must not pass as a skip.
#define KV_SKIP_OR_FAIL(why)                                                     \
  do {                                                                           \
    if (::kvasir::testing::AssetsRequired()) {                                   \
      FAIL() << (why) << " (KVASIR_REQUIRE_ASSETS=1: this must not be skipped)"; \
    } else {                                                                     \
      GTEST_SKIP() << (why);                                                     \
    }                                                                            \
  } while (0)

// Skips (or fails under KVASIR_REQUIRE_ASSETS=1) when the asset `rel` is missing.
#define KV_REQUIRE_ASSET(rel)                                                              \
  do {                                                                                     \
    const std::string kv_asset_path_ = ::kvasir::testing::AssetPath(rel);                  \
    if (!std::filesystem::exists(kv_asset_path_)) {                                        \
      if (::kvasir::testing::AssetsRequired()) {                                           \
        FAIL() << "required asset missing: " << kv_asset_path_;                            \
      } else {                                                                             \
        GTEST_SKIP() << "asset missing: " << kv_asset_path_ << " (set KVASIR_ASSETS)";     \
      }                                                                                    \
    }                                                                                      \
  } while (0)
