#include "base/sha256.h"

#include <openssl/evp.h>

#include "base/check.h"

namespace kvasir {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  KV_CHECK(impl_->ctx != nullptr);
  KV_CHECK(EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) == 1);
}

Sha256::~Sha256() {
  if (impl_ != nullptr && impl_->ctx != nullptr) EVP_MD_CTX_free(impl_->ctx);
}

Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&& other) noexcept {
  if (this != &other) {
    if (impl_ != nullptr && impl_->ctx != nullptr) EVP_MD_CTX_free(impl_->ctx);
    impl_ = std::move(other.impl_);
  }
  return *this;
}

void Sha256::Update(std::span<const uint8_t> bytes) {
  KV_CHECK(EVP_DigestUpdate(impl_->ctx, bytes.data(), bytes.size()) == 1);
}

Sha256Digest Sha256::Finish() {
  Sha256Digest d{};
  unsigned int len = 0;
  KV_CHECK(EVP_DigestFinal_ex(impl_->ctx, d.data(), &len) == 1 && len == d.size());
  KV_CHECK(EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) == 1);
  return d;
}

Sha256Digest Sha256Of(std::span<const uint8_t> bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.Finish();
}

std::string Sha256Hex(const Sha256Digest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < digest.size(); ++i) {
    s[2 * i] = kHex[digest[i] >> 4];
    s[2 * i + 1] = kHex[digest[i] & 15];
  }
  return s;
}

}  // namespace kvasir
