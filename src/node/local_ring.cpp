#include "node/local_ring.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "base/secret_file.h"

namespace kvasir::node {

Result<std::vector<net::Listener>> BindLoopback(int n) {
  std::vector<net::Listener> held;
  for (int i = 0; i < n; ++i) {
    KV_ASSIGN_OR_RETURN(net::Listener l, net::Listener::Bind("127.0.0.1", 0));
    held.push_back(std::move(l));
  }
  return held;
}

Result<pid_t> Spawn(const std::vector<std::string>& args, int stderr_fd, int inherit_fd) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return Error("cannot start a {} process: {}", args[1], std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the supervisor
    if (getppid() != parent) _exit(1);
    if (stderr_fd >= 0 && dup2(stderr_fd, STDERR_FILENO) < 0) _exit(126);
    if (inherit_fd >= 0 && fcntl(inherit_fd, F_SETFD, 0) != 0) _exit(126);
    // The supervisor may block these for sigwait(); a stage takes them itself.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  return pid;
}

LocalTrust::~LocalTrust() {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

std::string LocalTrust::KeyPath(int stage) const {
  return fmt::format("{}/stage{}.key", dir, stage);
}

Status MakeLocalTrust(LocalTrust* t) {
  std::string path = (std::filesystem::temp_directory_path() / "kvasir-ring-XXXXXX").string();
  if (mkdtemp(path.data()) == nullptr) {
    return Error("cannot create a directory for the ring secret: {}", std::strerror(errno));
  }
  t->dir = path;
  t->secret_path = path + "/ring.secret";
  KV_RETURN_IF_ERROR(WriteNewSecretFile(t->secret_path));
  KV_ASSIGN_OR_RETURN(t->secret, ReadSecretFile(t->secret_path, "ring secret"));
  return Status::Ok();
}

void StopAll(std::vector<Child>& children) {
  for (const Child& c : children) {
    if (c.pid > 0) kill(c.pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (Child& c : children) {
    while (c.pid > 0) {
      int status = 0;
      pid_t r = waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid || r < 0) {
        c.pid = -1;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &status, 0);
        c.pid = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace kvasir::node
