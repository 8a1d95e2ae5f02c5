// SHA-256, incremental (OpenSSL's EVP underneath). Used for tensor checksums in manifests and for
// the model identity.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace kvasir {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;

  void Update(std::span<const uint8_t> bytes);
  // Returns the digest and resets the hasher for reuse.
  Sha256Digest Finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

Sha256Digest Sha256Of(std::span<const uint8_t> bytes);
// 64 lower-case hex digits.
std::string Sha256Hex(const Sha256Digest& digest);

}  // namespace kvasir
