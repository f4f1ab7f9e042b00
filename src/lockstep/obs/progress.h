// The progress display of a training run: on a terminal one line redrawn in place (bar,
// samples/s, loss, ETA); elsewhere (logs, CI) a plain line every few seconds.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace lockstep {

class ProgressBar {
 public:
  // total_steps: steps this run will take (for the bar and ETA). out: stderr by default.
  ProgressBar(int64_t total_steps, bool quiet, FILE* out = stderr);
  // Called after each step; redraws at most ~10 times a second on a terminal, every
  // plain_interval_seconds otherwise.
  void update(int64_t step, int64_t epoch, double loss, double samples_per_second);
  // Ends the line (on a terminal) so later output starts clean.
  void finish();

  // "1:02:03" / "2:03" for seconds.
  static std::string format_duration(double seconds);

 private:
  std::string render(int64_t step, int64_t epoch, double loss, double samples_per_second, int width) const;

  int64_t total_steps_;
  bool quiet_;
  FILE* out_;
  bool interactive_;
  bool erases_line_;        // the terminal takes \033[K (not TERM=dumb)
  size_t drawn_width_ = 0;  // characters of the line last drawn
  double plain_interval_seconds_ = 5.0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
  int64_t first_step_ = -1;
};

}  // namespace lockstep
