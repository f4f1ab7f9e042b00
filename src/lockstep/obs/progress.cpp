#include "lockstep/obs/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace lockstep {
namespace {

// TERM=dumb (Emacs shells, some CI consoles) or no TERM: a terminal that moves the cursor
// with \r but knows no escape sequences, so \033[K would print as text.
bool terminal_is_dumb() {
  const char* term = std::getenv("TERM");
  return term == nullptr || *term == '\0' || std::strcmp(term, "dumb") == 0;
}

}  // namespace

ProgressBar::ProgressBar(int64_t total_steps, bool quiet, FILE* out)
    : total_steps_(total_steps),
      quiet_(quiet),
      out_(out),
      interactive_(isatty(fileno(out)) != 0),
      erases_line_(interactive_ && !terminal_is_dumb()),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

std::string ProgressBar::format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<int64_t>(seconds + 0.5);
  char buffer[32];
  if (total >= 3600) {
    std::snprintf(buffer, sizeof(buffer), "%lld:%02lld:%02lld", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60), static_cast<long long>(total % 60));
  } else {
    std::snprintf(buffer, sizeof(buffer), "%lld:%02lld", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  }
  return buffer;
}

std::string ProgressBar::render(int64_t step, int64_t epoch, double loss, double samples_per_second, int width) const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done_here = step - first_step_;
  const double per_step = done_here > 0 ? elapsed / static_cast<double>(done_here) : NAN;
  const double eta = per_step * static_cast<double>(total_steps_ - step);
  char stats[160];
  std::snprintf(stats, sizeof(stats), " %lld/%lld  epoch %lld  %.0f samples/s  loss %.4f  ETA %s",
                static_cast<long long>(step), static_cast<long long>(total_steps_), static_cast<long long>(epoch),
                samples_per_second, loss, format_duration(eta).c_str());
  if (!interactive_) return std::string("train") + stats;
  const int bar_width = std::clamp(width - static_cast<int>(std::string(stats).size()) - 3, 10, 40);
  const double fraction = total_steps_ > 0 ? std::clamp(static_cast<double>(step) / total_steps_, 0.0, 1.0) : 1.0;
  const int filled = static_cast<int>(fraction * bar_width);
  std::string bar(static_cast<size_t>(bar_width) + 2, ' ');
  bar.front() = '[';
  bar.back() = ']';
  for (int i = 0; i < filled; ++i) bar[static_cast<size_t>(i) + 1] = '=';
  if (filled < bar_width) bar[static_cast<size_t>(filled) + 1] = '>';
  bar.append(stats);
  return bar;
}

void ProgressBar::update(int64_t step, int64_t epoch, double loss, double samples_per_second) {
  if (quiet_) return;
  if (first_step_ < 0) first_step_ = step - 1;
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_draw_).count();
  const bool last = step >= total_steps_;
  if (interactive_) {
    if (drawn_ && since < 0.1 && !last) return;
    winsize ws{};
    const int width = ioctl(fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 100;
    const std::string line = render(step, epoch, loss, samples_per_second, width);
    if (erases_line_) {
      std::fprintf(out_, "\r\033[K%s", line.c_str());
    } else {  // spaces cover what is left of a longer previous line
      const size_t pad = drawn_width_ > line.size() ? drawn_width_ - line.size() : 0;
      std::fprintf(out_, "\r%s%s", line.c_str(), std::string(pad, ' ').c_str());
    }
    drawn_width_ = line.size();
  } else {
    if (drawn_ && since < plain_interval_seconds_ && !last) return;
    std::fprintf(out_, "%s\n", render(step, epoch, loss, samples_per_second, 0).c_str());
  }
  std::fflush(out_);
  drawn_ = true;
  last_draw_ = now;
}

void ProgressBar::finish() {
  if (quiet_ || !drawn_) return;
  if (interactive_) std::fprintf(out_, "\n");
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace lockstep
