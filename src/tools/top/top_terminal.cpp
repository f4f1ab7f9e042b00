#include "tools/top/top_terminal.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace lockstep::tools {
namespace {

void write_stdout(const std::string& bytes) {
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = write(STDOUT_FILENO, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    written += static_cast<size_t>(n);
  }
}

winsize window_size() {
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) != 0 || size.ws_col == 0 || size.ws_row == 0) {
    size.ws_col = 80;
    size.ws_row = 24;
  }
  return size;
}

}  // namespace

bool stdout_is_capable_terminal() {
  const char* term = std::getenv("TERM");
  return isatty(STDOUT_FILENO) && term != nullptr && *term != '\0' && std::strcmp(term, "dumb") != 0;
}

TerminalSession::TerminalSession() {
  keys_ = isatty(STDIN_FILENO) != 0;
  if (keys_ && tcgetattr(STDIN_FILENO, &saved_) == 0) {
    termios raw = saved_;
    // Keys arrive one by one and are not echoed; ISIG stays on so Ctrl-C is a SIGINT, which
    // the loop turns into an orderly exit.
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    raw_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
  // Alternate screen, hidden cursor, cleared once: later frames overwrite in place.
  write_stdout("\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J");
}

TerminalSession::~TerminalSession() {
  write_stdout("\x1b[?25h\x1b[?1049l");
  if (raw_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
}

void TerminalSession::draw(const std::string& bytes) const { write_stdout(bytes); }

size_t TerminalSession::columns() const { return window_size().ws_col; }
size_t TerminalSession::rows() const { return window_size().ws_row; }

bool TerminalSession::wait_for_quit(double seconds) const {
  const int ms = static_cast<int>(seconds * 1000);
  // Keys come only from a terminal: stdin from /dev/null or a pipe would read "ready" forever.
  if (!keys_) return poll(nullptr, 0, ms), false;
  pollfd key = {STDIN_FILENO, POLLIN, 0};
  const int ready = poll(&key, 1, ms);
  if (ready <= 0) return false;                               // timeout, or a signal (EINTR)
  if ((key.revents & (POLLHUP | POLLERR)) != 0) return true;  // the terminal is gone
  char c = 0;
  while (read(STDIN_FILENO, &c, 1) == 1)
    if (c == 'q' || c == 'Q' || c == 3) return true;
  return false;
}

}  // namespace lockstep::tools
