// Running a short-lived helper program and keeping what it printed: for the probes that ask
// another program (a Python interpreter, a framework inside it) what it knows. A probe
// that hangs is killed, with its whole process group, when its time is up.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace lockstep::tools {

struct CapturedRun {
  bool started = false;    // false: the program could not be executed (`error` says why)
  bool timed_out = false;  // killed when the time was up
  int exit_code = -1;      // when it exited
  int signal = 0;          // when a signal ended it
  std::string out, err;
  std::string error;
};

// Runs argv[0] (found on PATH when it has no slash) with this process's environment and
// `extra_env` on top, stdin from /dev/null, stdout and stderr captured (each up to `max_bytes`).
CapturedRun run_captured(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                         const std::map<std::string, std::string>& extra_env = {}, size_t max_bytes = size_t{1} << 20);

}  // namespace lockstep::tools
