// The terminal while `lockstep top` owns it: the alternate screen, a hidden cursor and
// keys read one at a time without echo. Whatever way top ends (q, Ctrl-C, SIGTERM, SIGHUP,
// an error), the terminal is given back as it was: the destructor restores it, and the
// signals only set a flag the loop checks, so the destructor always runs.
#pragma once

#include <termios.h>

#include <cstddef>
#include <string>

namespace lockstep::tools {

class TerminalSession {
 public:
  TerminalSession();   // raw keys, alternate screen, hidden cursor
  ~TerminalSession();  // cursor shown, main screen back, termios as before
  TerminalSession(const TerminalSession&) = delete;
  TerminalSession& operator=(const TerminalSession&) = delete;

  void draw(const std::string& bytes) const;
  // Columns and rows now (TIOCGWINSZ); 80x24 when the terminal does not say.
  size_t columns() const;
  size_t rows() const;

  // Waits up to `seconds` for a key; true when q, Q or Ctrl-C was pressed. Returns early
  // (false) when a signal arrives, e.g. SIGWINCH, so the caller redraws at the new size.
  bool wait_for_quit(double seconds) const;

 private:
  termios saved_{};
  bool raw_ = false;
  bool keys_ = false;  // stdin is a terminal to read keys from
};

// stdout is a terminal that can draw the full view (TERM set and not "dumb").
bool stdout_is_capable_terminal();

}  // namespace lockstep::tools
