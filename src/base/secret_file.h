// Shared secrets in files: the ring secret (stages of one ring, and the relay's edge tokens) and
// the client secret (a bearer secret a head may require of its clients).
#pragma once

#include <cstddef>
#include <string>

#include "base/status.h"

namespace kvasir {

inline constexpr size_t kMinSecretBytes = 16;

// The file's bytes minus one trailing newline (and carriage return); at least 16 bytes. `what`
// names the secret in errors ("ring secret"). Warns when others may read the file.
Result<std::string> ReadSecretFile(const std::string& path, const std::string& what = "secret");
// Writes a fresh random secret (32 bytes as 64 hex digits and a newline) to a new file of mode
// 0600. Refuses to overwrite an existing file.
Status WriteNewSecretFile(const std::string& path);

}  // namespace kvasir
