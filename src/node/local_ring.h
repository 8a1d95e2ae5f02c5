// The processes of a local ring, shared by `kvasir run` and `kvasir serve -m`: loopback listeners
// bound once and handed to the stages, the trust material of a fresh ring (a secret and a node key
// per stage, in a private temporary directory), starting `kvasir` subprocesses that die with
// their parent, and stopping them.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/status.h"
#include "net/stream.h"

namespace kvasir::node {

struct Child {
  pid_t pid = -1;
  std::string name;
};

// `n` loopback listeners on free ports. Each is handed to its stage (--listen-fd), so no port is
// ever left unbound for another process to take between here and the stage.
Result<std::vector<net::Listener>> BindLoopback(int n);

// Starts `kvasir <args...>` (this binary). With `stderr_fd` >= 0 the child's stderr goes there;
// `inherit_fd` (>= 0) stays open in the child under the same number. The child gets SIGTERM when
// this process dies.
Result<pid_t> Spawn(const std::vector<std::string>& args, int stderr_fd = -1, int inherit_fd = -1);

// The trust material of a local ring, in a private temporary directory (mode 0700) removed at
// the end: a fresh ring secret (the stages' handshakes, the relay's edge tokens, the client's
// check of the head) and one node key per stage.
struct LocalTrust {
  std::string dir;
  std::string secret_path;
  std::string secret;

  LocalTrust() = default;
  LocalTrust(const LocalTrust&) = delete;
  LocalTrust& operator=(const LocalTrust&) = delete;
  ~LocalTrust();
  std::string KeyPath(int stage) const;
};
Status MakeLocalTrust(LocalTrust* t);

// SIGTERM to every child, then waits for them (SIGKILL after 5 s).
void StopAll(std::vector<Child>& children);

}  // namespace kvasir::node
