// A `kvasir` server (relay, market) started as a user starts it, for the flood tests: its stdout
// and stderr are read on a pipe, so a test waits for the line that says it listens instead of a
// fixed time, and its memory is read from /proc/<pid>/status. It dies with the test
// (PR_SET_PDEATHSIG); the destructor stops it with SIGTERM and reaps it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvasir::testing {

class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> args) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    args.insert(args.begin(), KVASIR_BINARY);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int null_fd = ::open("/dev/null", O_RDONLY);
      if (null_fd < 0) _exit(126);
      ::dup2(null_fd, 0);
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    ::close(fds[1]);
    out_fd_ = fds[0];
    reader_ = std::thread([this] { Read(); });
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    if (reader_.joinable()) reader_.join();  // the pipe ends with the process
    if (out_fd_ >= 0) ::close(out_fd_);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  pid_t pid() const { return pid_; }

  // The first line of its output containing `text`, waiting up to `timeout_ms` for it; "" if it
  // did not come (the process ended, or the time passed).
  std::string WaitForLine(const std::string& text, int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      const size_t at = out_.find(text);
      if (at != std::string::npos) {
        const size_t begin = out_.rfind('\n', at);
        const size_t end = out_.find('\n', at);
        if (end != std::string::npos) {
          return out_.substr(begin == std::string::npos ? 0 : begin + 1,
                             end - (begin == std::string::npos ? 0 : begin + 1));
        }
      }
      if (ended_) return "";
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return "";
    }
  }

  // The port in a line such as "relay: listening on 127.0.0.1:40123 (ws, no TLS)"; 0 if none.
  static uint16_t PortIn(const std::string& line) {
    const size_t colon = line.find(':', line.find("listening on"));
    if (colon == std::string::npos) return 0;
    return static_cast<uint16_t>(std::strtoul(line.c_str() + colon + 1, nullptr, 10));
  }

  std::string output() {
    std::lock_guard<std::mutex> lock(mu_);
    return out_;
  }

  // A field of /proc/<pid>/status in bytes ("VmHWM", the peak resident memory; "VmRSS", now).
  uint64_t StatusBytes(const std::string& field) const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(field + ":", 0) == 0) {
        return std::stoull(line.substr(field.size() + 1)) * 1024;
      }
    }
    return 0;
  }

 private:
  void Read() {
    char buf[4096];
    while (true) {
      const ssize_t n = ::read(out_fd_, buf, sizeof(buf));
      if (n <= 0) break;
      std::lock_guard<std::mutex> lock(mu_);
      // Keep the start (where the listening line is) and the end; a flood can log a lot.
      if (out_.size() > (size_t{4} << 20)) out_.erase(size_t{1} << 20, out_.size() / 2);
      out_.append(buf, static_cast<size_t>(n));
      changed_.notify_all();
    }
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
    changed_.notify_all();
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::string out_;
  bool ended_ = false;
};

}  // namespace kvasir::testing
