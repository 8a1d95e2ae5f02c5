#include "node/progress.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "base/human.h"
#include "base/log.h"

namespace kvasir::node {

bool StderrIsTty() { return ::isatty(STDERR_FILENO) == 1; }

bool StdoutIsStderr() {
  struct stat out {
  }, err{};
  return ::fstat(STDOUT_FILENO, &out) == 0 && ::fstat(STDERR_FILENO, &err) == 0 &&
         out.st_dev == err.st_dev && out.st_ino == err.st_ino;
}

ProgressBar::ProgressBar(std::string label, bool tty) : label_(std::move(label)), tty_(tty) {}

std::string ProgressBar::FormatEta(double s) {
  if (!(s >= 0) || s > 360000) return "?";
  const long t = std::lround(s);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
  return fmt::format("{}:{:02}", t / 60, t % 60);
}

void ProgressBar::Update(uint64_t done, uint64_t total, uint64_t fresh, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  const double frac = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const double rate = seconds > 0 ? static_cast<double>(fresh) / seconds : 0.0;
  const double eta = rate > 0 ? static_cast<double>(total - std::min(done, total)) / rate : -1;
  const std::string figures = fmt::format(
      "{:3.0f}%  {} / {}  {}/s  ETA {}", frac * 100, HumanBytes(done), HumanBytes(total),
      HumanBytes(static_cast<uint64_t>(rate)), done >= total ? "0:00" : FormatEta(eta));
  if (tty_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r%s [%s] %s\x1b[K", label_.c_str(), bar.c_str(), figures.c_str());
    std::fflush(stderr);
    drawn_ = true;
    return;
  }
  const int decile = static_cast<int>(frac * 10);
  if (decile != last_decile_ || seconds - last_log_s_ >= 10) {
    last_decile_ = decile;
    last_log_s_ = seconds;
    KV_LOG_INFO("{}: {}", label_, figures);
  }
}

void ProgressBar::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (tty_ && drawn_) std::fputc('\n', stderr);
  drawn_ = false;
}

}  // namespace kvasir::node
