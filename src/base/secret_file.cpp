#include "base/secret_file.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/log.h"

namespace kvasir {

Result<std::string> ReadSecretFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error("{}: cannot read the {}: {}", path, what, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (!s.empty() && s.back() == '\r') s.pop_back();
  if (s.size() < kMinSecretBytes) {
    return Error(
        "{}: a {} needs at least {} bytes (got {}); e.g. head -c 32 /dev/urandom | od -An -tx1 "
        "| tr -d ' \\n' > {}",
        path, what, kMinSecretBytes, s.size(), path);
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    KV_LOG_WARN("{}: the {} may be read by others (mode {:04o}); chmod 600 {}", path, what,
                st.st_mode & 07777, path);
  }
  return s;
}

Status WriteNewSecretFile(const std::string& path) {
  uint8_t raw[32];
  if (RAND_bytes(raw, sizeof(raw)) != 1) {
    return Error("{}: cannot draw random bytes for the secret", path);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * sizeof(raw) + 1);
  for (uint8_t b : raw) {
    text.push_back(kHex[b >> 4]);
    text.push_back(kHex[b & 15]);
  }
  text.push_back('\n');
  OPENSSL_cleanse(raw, sizeof(raw));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Error("{}: cannot create the secret file: {}", path, std::strerror(errno));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int err = errno;
  ::close(fd);
  OPENSSL_cleanse(text.data(), text.size());
  if (!ok) return Error("{}: cannot write the secret file: {}", path, std::strerror(err));
  return Status::Ok();
}

}  // namespace kvasir
