// A real nginx (the Debian package) on loopback for fetch tests, run from a private config in a
// temporary directory: `/` serves `root` with byte ranges, `/norange/` the same files with ranges
// switched off (max_ranges 0), `/slow/` at a limited rate per connection; and, when openssl can
// make a self-signed certificate, the same over https on a second port. Under
// KVASIR_REQUIRE_ASSETS=1 a certificate openssl cannot make fails Start instead.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "test_assets.h"

namespace kvasir::testing {

class Nginx {
 public:
  struct Options {
    std::string root;                // directory served
    std::string slow_rate = "512k";  // limit_rate of /slow/
    bool tls = true;
  };
  // Starts nginx; nullptr and *why when nginx is not installed or does not come up.
  static std::unique_ptr<Nginx> Start(const Options& options, std::string* why);
  ~Nginx();

  std::string Url(const std::string& path) const;
  // https URL, "" when TLS is off (then tls_why() says why); ca_file() is the certificate to trust.
  std::string TlsUrl(const std::string& path) const;
  const std::string& tls_why() const { return tls_why_; }
  const std::string& ca_file() const { return cert_; }
  // Kills nginx at once (SIGKILL: open transfers are cut; new connections wait in the backlog of
  // the sockets the fixture holds) / starts it again on the same sockets.
  void Kill();
  bool Restart(std::string* why);
  const std::string& error_log() const { return error_log_; }

 private:
  Nginx() = default;
  bool Launch(std::string* why);
  std::string dir_, conf_, cert_, error_log_, tls_why_;
  uint16_t port_ = 0, tls_port_ = 0;
  int fd_ = -1, tls_fd_ = -1;  // the listening sockets, bound once and held; nginx inherits them
  pid_t pid_ = -1;
};

// The nginx binary, or "" when it is not installed.
std::string FindNginx();

}  // namespace kvasir::testing

// Starts nginx into `var` (a std::unique_ptr<Nginx>), or skips the test (fails it under
// KVASIR_REQUIRE_ASSETS=1, as CI installs nginx) when nginx is unavailable.
#define KV_START_NGINX(var, options)                                          \
  std::unique_ptr<::kvasir::testing::Nginx> var;                              \
  do {                                                                        \
    std::string kv_why_;                                                      \
    var = ::kvasir::testing::Nginx::Start(options, &kv_why_);                 \
    if (var == nullptr) {                                                     \
      if (::kvasir::testing::AssetsRequired()) {                              \
        FAIL() << "nginx is required (KVASIR_REQUIRE_ASSETS=1): " << kv_why_; \
      }                                                                       \
      GTEST_SKIP() << "nginx unavailable: " << kv_why_;                       \
    }                                                                         \
  } while (0)
