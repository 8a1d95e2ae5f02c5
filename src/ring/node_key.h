// Node identity: an Ed25519 key pair (libsodium). A node's public key is its name on an open
// network: neighbours authenticate each other's links with it, a manifest lists it per rank, and
// receipts are signed with it.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kvasir::ring {

inline constexpr size_t kPublicKeyBytes = 32;
inline constexpr size_t kSignatureBytes = 64;
using PublicKey = std::array<uint8_t, kPublicKeyBytes>;
using Signature = std::array<uint8_t, kSignatureBytes>;

class NodeKey {
 public:
  // A fresh random key pair.
  static NodeKey Generate();
  // The key pair of a 32-byte seed (deterministic; for tests and known-answer vectors).
  static NodeKey FromSeed(std::span<const uint8_t, 32> seed);
  // Reads a key file written by Save(). Refuses a file that others may read (like ssh does), a
  // wrong format or a seed that is not 64 hex digits; errors name the file.
  static Result<NodeKey> Load(const std::string& path);
  // Loads `path`, or creates it (mode 0600, parent directories 0700) when it does not exist. Safe
  // against several processes creating the same file at once: exactly one key wins and every
  // caller gets it. *created tells whether this call made it.
  static Result<NodeKey> LoadOrCreate(const std::string& path, bool* created = nullptr);

  const PublicKey& public_key() const { return public_; }
  Signature Sign(std::span<const uint8_t> message) const;

 private:
  std::array<uint8_t, 32> seed_{};
  std::array<uint8_t, 64> secret_{};  // libsodium's form: seed || public key
  PublicKey public_{};
};

// Whether `signature` is `key`'s Ed25519 signature of `message`.
bool VerifySignature(const PublicKey& key, std::span<const uint8_t> message,
                     const Signature& signature);

// 64 lowercase hex digits.
std::string PublicKeyHex(const PublicKey& key);
// The first 8 hex digits, for logs ("node 3fa91c07").
std::string ShortKey(const PublicKey& key);
// Parses 64 hex digits (either case). Errors say what is wrong with the text.
Result<PublicKey> ParsePublicKey(std::string_view text);

// $XDG_STATE_HOME/kvasir/node.key, else ~/.local/state/kvasir/node.key.
std::string DefaultKeyPath();

// libsodium is initialised (idempotent, thread-safe). Aborts when the library cannot start, which
// only happens on a broken system.
void InitCrypto();

}  // namespace kvasir::ring
