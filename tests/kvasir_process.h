// Runs the `kvasir` binary under test (KVASIR_BINARY) as a child process and captures its exit
// status, stdout and stderr, for the end-to-end tests of every module.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "test_assets.h"

namespace kvasir::testing {

struct RunResult {
  int code = -1;  // exit status, or 128 + signal
  std::string out;
  std::string err;
};

// `kvasir ARGS` with stdin from /dev/null and `env` added to the environment.
inline RunResult RunKvasir(const std::vector<std::string>& args,
                           const std::vector<std::pair<std::string, std::string>>& env = {}) {
  TempDir dir;
  const std::string out_path = dir.File("stdout"), err_path = dir.File("stderr");
  std::vector<std::string> argv_s = {KVASIR_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  RunResult r;
  const pid_t pid = fork();
  if (pid == 0) {
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int null_in = open("/dev/null", O_RDONLY);
    if (out < 0 || err < 0 || null_in < 0) _exit(126);
    dup2(null_in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid) {
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  r.out = ReadFileToString(out_path);
  r.err = ReadFileToString(err_path);
  return r;
}

// "exit N", then the start of stdout and stderr: for assertion messages.
inline std::string Describe(const RunResult& r) {
  return "exit " + std::to_string(r.code) + "\n--- stdout:\n" + r.out.substr(0, 4000) +
         "\n--- stderr:\n" + r.err.substr(0, 4000);
}

// The last line of `s` (the error line a failing command prints after its logs).
inline std::string LastLine(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// `kvasir synth` arguments for a tiny llama (64 wide, 4 heads, 2 KV heads, ff 128) with the
// stories260K tokenizer.
inline std::vector<std::string> SynthArgs(const std::string& out, const std::string& type,
                                          const std::string& seed = "7",
                                          const std::string& layers = "2") {
  return {"synth", "--arch", "llama", "--layers", layers, "--embd", "64", "--heads", "4",
          "--kv-heads", "2", "--ff", "128", "--vocab-from",
          AssetPath("models/stories260K.gguf"), "--type", type, "--seed", seed, "-o", out};
}

// `kvasir synth` arguments for a small Qwen3.5 hybrid with the stories260K tokenizer: `layers`
// layers 64 wide (4 query heads and 2 KV heads of 32, SSM state 16 in 2 groups, 4 value heads);
// as FFN, 4 experts of 64 with 2 used (qwen35moe) or a dense one `dense_ff` wide (qwen35).
inline std::vector<std::string> HybridSynthArgs(const std::string& out, const std::string& arch,
                                                const std::string& type, const std::string& seed,
                                                const std::string& layers = "4",
                                                const std::string& dense_ff = "96") {
  std::vector<std::string> v = {"synth", "--arch", arch, "--layers", layers, "--type",
                                type,    "--seed", seed, "-o",       out};
  for (const char* a : {"--embd", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
                        "--ssm-state", "16", "--ssm-groups", "2", "--ssm-v-heads", "4"}) {
    v.push_back(a);
  }
  v.insert(v.end(), {"--vocab-from", AssetPath("models/stories260K.gguf")});
  if (arch == "qwen35moe") {
    v.insert(v.end(), {"--experts", "4", "--experts-used", "2", "--expert-ff", "64"});
  } else {
    v.insert(v.end(), {"--ff", dense_ff});
  }
  return v;
}

// A usage error: exit 2, nothing on stdout, one line "kvasir <cmd>: ..." naming `mentions` and
// pointing to --help.
inline void ExpectUsageError(const RunResult& r, const std::string& cmd,
                             const std::string& mentions) {
  EXPECT_EQ(r.code, 2) << Describe(r);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_THAT(r.err, ::testing::StartsWith("kvasir " + cmd + ": "));
  EXPECT_THAT(r.err, ::testing::HasSubstr(mentions));
  EXPECT_THAT(r.err, ::testing::HasSubstr("kvasir " + cmd + " --help"));
}

// A runtime error: exit 1 and a last stderr line "kvasir <cmd>: ..." that mentions `mentions`.
inline void ExpectRuntimeError(const RunResult& r, const std::string& cmd,
                               const std::string& mentions) {
  EXPECT_EQ(r.code, 1) << Describe(r);
  EXPECT_THAT(LastLine(r.err), ::testing::StartsWith("kvasir " + cmd + ": ")) << r.err;
  EXPECT_THAT(LastLine(r.err), ::testing::HasSubstr(mentions)) << r.err;
}

// A process in the background (a stage, a relay): stdout and stdin on /dev/null, stderr appended
// to `log` (inherited when empty), `inherit_fds` left open for it. It dies with the test
// (PR_SET_PDEATHSIG); the destructor sends `stop_signal` (after SIGCONT, for a stopped one) and
// reaps it unless it already ended.
class ChildProcess {
 public:
  ChildProcess(std::vector<std::string> args, std::string log = "", int stop_signal = SIGKILL,
               std::vector<int> inherit_fds = {})
      : args_(std::move(args)),
        log_(std::move(log)),
        stop_signal_(stop_signal),
        inherit_fds_(std::move(inherit_fds)) {
    Start();
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { Kill(stop_signal_); }

  // Starts it (again, after Kill or its end) with the same arguments.
  void Start() {
    std::vector<char*> argv;
    for (auto& a : args_) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int null_fd = open("/dev/null", O_RDWR);
      if (null_fd < 0) _exit(126);
      dup2(null_fd, 0);
      dup2(null_fd, 1);
      if (!log_.empty()) {
        const int err = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (err < 0) _exit(126);
        dup2(err, 2);
      }
      for (int fd : inherit_fds_) {
        if (fcntl(fd, F_SETFD, 0) != 0) _exit(126);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  void Signal(int sig) const {
    if (pid_ > 0) kill(pid_, sig);
  }
  // Sends `sig` and waits for the process to end.
  void Kill(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, SIGCONT);
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  bool Alive() {
    int status = 0;
    return pid_ > 0 && waitpid(pid_, &status, WNOHANG) == 0;
  }
  // The wait status if the process has ended on its own, else -1.
  int Ended() {
    int status = 0;
    if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return status;
    }
    return -1;
  }
  pid_t pid() const { return pid_; }
  std::string log() const { return ReadFileToString(log_); }

 private:
  std::vector<std::string> args_;
  std::string log_;
  int stop_signal_;
  std::vector<int> inherit_fds_;
  pid_t pid_ = -1;
};

}  // namespace kvasir::testing
