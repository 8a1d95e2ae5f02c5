// A ring started the documented way for attack tests: three `kvasir stage` processes of
// stories260K (layers 0:2, 2:4, 4:5) sharing a ring secret file, and what the tests measure of it:
// the peak memory of every stage process (VmHWM, reset before each attack), whether memory and
// threads come back after it, and how long an honest client waits while an attack runs.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvasir_process.h"
#include "ring_test_util.h"

namespace kvasir::testing {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t);

// A number field of /proc/PID/status ("VmRSS:", "VmHWM:" in kB; "Threads:"), 0 if it is gone.
uint64_t StatusField(pid_t pid, const std::string& field);
inline uint64_t RssOf(pid_t pid) { return StatusField(pid, "VmRSS:") * 1024; }
inline uint64_t PeakOf(pid_t pid) { return StatusField(pid, "VmHWM:") * 1024; }
inline int ThreadsOf(pid_t pid) { return static_cast<int>(StatusField(pid, "Threads:")); }
// Sets the process's peak (VmHWM) back to its current RSS (/proc/PID/clear_refs, "5").
bool ResetPeak(pid_t pid);

// Waits up to `ms` for `pred`, checking it every few milliseconds.
bool WaitFor(const std::function<bool()>& pred, int ms);
// Waits up to `ms` for `needle` to appear in the file `path`, woken by each write to it
// (inotify). True when it is there.
bool WaitForText(const std::string& path, const std::string& needle, int ms);
// How many times `needle` occurs in `text`.
size_t CountOf(const std::string& text, const std::string& needle);

// What an honest client saw: the time to connect (handshake and HELLO), to its first token, the
// longest gap between two tokens, and the tokens.
struct HonestRun {
  bool ok = false;
  std::string error;
  double connect_s = 0, first_token_s = 0, max_gap_s = 0;
  std::vector<int32_t> ids;
  double worst() const { return std::max({connect_s, first_token_s, max_gap_s}); }
};
HonestRun RunHonestClient(const std::string& head, const std::string& prompt, int n_predict);

// Runs `attack` on `n` threads until destroyed (the attack polls `running`).
class Flood {
 public:
  Flood(int n, std::function<void(int i, const std::atomic<bool>& running)> attack);
  ~Flood();
  void Stop();

 private:
  std::atomic<bool> running_{true};
  std::vector<std::thread> threads_;
};

class AttackRing {
 public:
  static constexpr int kLinkTimeoutS = 3;
  static constexpr int kRepairTimeoutS = 2;  // no standby comes: held sessions end after it
  static constexpr const char* kPrompt = "Once upon a time";
  static constexpr uint64_t kMaxGrowth = 64u << 20;  // what an attack may add to a stage's peak

  // Starts the ring and waits for it to serve; `extra` flags go to every stage.
  explicit AttackRing(const std::string& model, const std::vector<std::string>& extra = {});
  ~AttackRing();
  bool ready() const { return ready_; }

  const std::string& head() const { return head_; }
  uint16_t port(int i) const { return ports_[i]; }
  ChildProcess& stage(int i) { return *stages_[i]; }
  std::string log_path(int i) const;
  const Generation& expected() const { return expected_; }

  // Remembers every stage's RSS as its idle level and resets its peak: the next
  // ExpectPeakBounded() measures from here.
  void MarkIdle();
  // The peak of every stage since MarkIdle() stayed within kMaxGrowth of its idle RSS.
  void ExpectPeakBounded(const std::string& when);
  // Every stage's RSS comes back within `slack` of its idle level (waits up to 10 s).
  void ExpectMemoryReturns(const std::string& when, uint64_t slack = 8u << 20);
  // The ring answers exactly as one process, for 8 concurrent clients, and every stage lives.
  void ExpectServes();
  // One honest client during an attack: served exactly, and never kept waiting 1 s or more.
  // Returns how long it waited at worst.
  double ExpectHonestServedWithin1s(const std::string& when, bool print = true);

 private:
  TempDir dir_;
  std::string model_, head_;
  std::unique_ptr<BoundPorts> bound_;  // held while the stages run (they may be restarted)
  std::vector<uint16_t> ports_;
  std::vector<std::unique_ptr<ChildProcess>> stages_;
  std::vector<uint64_t> idle_;
  Generation expected_;
  bool ready_ = false;
};

}  // namespace kvasir::testing
