// Progress of long transfers: a one-line bar with bytes, rate and ETA redrawn in place on a
// terminal; plain log lines (every 10% or 10 s) when stderr is a file or a pipe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

namespace kvasir::node {

class ProgressBar {
 public:
  // `label` starts every line ("fetch layers 0:4"). `tty` selects the in-place bar.
  ProgressBar(std::string label, bool tty);
  // done/total bytes; `fresh` = bytes transferred by this run (for the rate), over `seconds`.
  void Update(uint64_t done, uint64_t total, uint64_t fresh, double seconds);
  // Ends the bar's line (a terminal keeps the last bar on screen).
  void Finish();

  // "1:05", "12:00:01"; "?" for a negative or absurd value.
  static std::string FormatEta(double seconds);

 private:
  std::mutex mu_;
  std::string label_;
  bool tty_;
  bool drawn_ = false;
  int last_decile_ = -1;
  double last_log_s_ = 0;
};

// Whether stderr is a terminal.
bool StderrIsTty();
// Whether stdout and stderr are the same file or pipe (as with `2>&1`), so that text on stdout
// should end its line before a summary goes to stderr.
bool StdoutIsStderr();

}  // namespace kvasir::node
