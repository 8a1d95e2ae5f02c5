#include "ring/node_key.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/check.h"

namespace kvasir::ring {
namespace {

constexpr std::string_view kKeyFileHeader = "kvasir-node-key-v1";

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string Hex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

// Parses exactly out.size() bytes of hex; `what` names the text in errors.
Status ParseHex(std::string_view text, std::span<uint8_t> out, std::string_view what) {
  if (text.size() != out.size() * 2) {
    return Error("{} must be {} hex digits, got {} characters", what, out.size() * 2, text.size());
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = HexValue(text[2 * i]), lo = HexValue(text[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return Error("{}: character {} is not a hex digit", what, hi < 0 ? 2 * i + 1 : 2 * i + 2);
    }
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return Status::Ok();
}

std::string FileText(const NodeKey& key, std::span<const uint8_t, 32> seed) {
  return fmt::format("{}\nseed {}\npublic {}\n", kKeyFileHeader, Hex(seed),
                     PublicKeyHex(key.public_key()));
}

}  // namespace

void InitCrypto() {
  static const int rc = sodium_init();
  KV_CHECK(rc >= 0, "libsodium failed to initialise");
}

NodeKey NodeKey::Generate() {
  InitCrypto();
  std::array<uint8_t, 32> seed;
  randombytes_buf(seed.data(), seed.size());
  NodeKey k = FromSeed(seed);
  sodium_memzero(seed.data(), seed.size());
  return k;
}

NodeKey NodeKey::FromSeed(std::span<const uint8_t, 32> seed) {
  InitCrypto();
  NodeKey k;
  std::memcpy(k.seed_.data(), seed.data(), 32);
  crypto_sign_seed_keypair(k.public_.data(), k.secret_.data(), k.seed_.data());
  return k;
}

Signature NodeKey::Sign(std::span<const uint8_t> message) const {
  Signature sig;
  crypto_sign_detached(sig.data(), nullptr, message.data(), message.size(), secret_.data());
  return sig;
}

bool VerifySignature(const PublicKey& key, std::span<const uint8_t> message,
                     const Signature& signature) {
  InitCrypto();
  return crypto_sign_verify_detached(signature.data(), message.data(), message.size(),
                                     key.data()) == 0;
}

Result<NodeKey> NodeKey::Load(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Error(errno == ENOENT ? StatusCode::kUnavailable : StatusCode::kInvalidInput,
                 "{}: cannot read the node key: {}", path, std::strerror(errno));
  }
  if ((st.st_mode & 077) != 0) {
    return Error("{}: the node key may be read by others (mode {:04o}); run: chmod 600 {}", path,
                 st.st_mode & 07777, path);
  }
  std::ifstream in(path);
  if (!in) return Error("{}: cannot read the node key: {}", path, std::strerror(errno));
  std::string header, seed_word, seed_hex, public_word, public_hex;
  in >> header >> seed_word >> seed_hex >> public_word >> public_hex;
  if (header != kKeyFileHeader || seed_word != "seed") {
    return Error("{}: not a Kvasir node key (expected a first line '{}' and a 'seed' line)", path,
                 kKeyFileHeader);
  }
  std::array<uint8_t, 32> seed;
  KV_RETURN_IF_ERROR(ParseHex(seed_hex, seed, path + ": seed"));
  NodeKey k = FromSeed(seed);
  sodium_memzero(seed.data(), seed.size());
  if (public_word == "public") {
    PublicKey stated;
    KV_RETURN_IF_ERROR(ParseHex(public_hex, stated, path + ": public"));
    if (stated != k.public_) {
      return Error("{}: the public key line does not belong to the seed (file edited or damaged)",
                   path);
    }
  }
  return k;
}

Result<NodeKey> NodeKey::LoadOrCreate(const std::string& path, bool* created) {
  if (created != nullptr) *created = false;
  auto loaded = Load(path);
  if (loaded.ok() || loaded.status().code() != StatusCode::kUnavailable) return loaded;
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::exists(parent, ec)) {
    std::filesystem::create_directories(parent, ec);
    if (ec) return Error("{}: cannot create the directory: {}", parent.string(), ec.message());
    std::filesystem::permissions(parent, std::filesystem::perms::owner_all, ec);
  }
  NodeKey k = Generate();
  const std::string text = FileText(k, k.seed_);
  // Write a private temporary file, then link() it into place: link fails when another process
  // created the key first, and then that key is the one everybody uses.
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());  // mode 0600, a name no other creator uses
  if (fd < 0) return Error("{}: cannot create the node key: {}", tmp, std::strerror(errno));
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                       ::fsync(fd) == 0;
  const int write_errno = errno;
  ::close(fd);
  if (!written) {
    ::unlink(tmp.c_str());
    return Error("{}: cannot write the node key: {}", tmp, std::strerror(write_errno));
  }
  const int rc = ::link(tmp.c_str(), path.c_str());
  const int link_errno = errno;
  ::unlink(tmp.c_str());
  if (rc != 0) {
    if (link_errno == EEXIST) return Load(path);
    return Error("{}: cannot create the node key: {}", path, std::strerror(link_errno));
  }
  if (created != nullptr) *created = true;
  return k;
}

std::string PublicKeyHex(const PublicKey& key) { return Hex(key); }

std::string ShortKey(const PublicKey& key) { return Hex(std::span(key).first(4)); }

Result<PublicKey> ParsePublicKey(std::string_view text) {
  PublicKey k;
  KV_RETURN_IF_ERROR(ParseHex(text, k, fmt::format("node key '{}'", text.substr(0, 80))));
  return k;
}

std::string DefaultKeyPath() {
  if (const char* d = std::getenv("XDG_STATE_HOME"); d != nullptr && *d != '\0') {
    return std::string(d) + "/kvasir/node.key";
  }
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    return std::string(h) + "/.local/state/kvasir/node.key";
  }
  return ".kvasir-node.key";
}

}  // namespace kvasir::ring
