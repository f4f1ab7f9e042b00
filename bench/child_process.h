// Runs a benchmark's measurement in a child process of its own (fork + exec), so its peak RSS
// (wait4's rusage) is that run's alone. The child reports on stdout with one line
// "RESULT key=value ...", or "SKIP reason" when it cannot run here.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::bench {

struct ChildResult {
  bool ok = false;
  std::string failure;  // why not ok
  std::map<std::string, std::string> values;
  double peak_rss_mb = 0;
};

// Runs argv with the extra environment, stdout captured, stderr passed through; peak RSS
// from wait4's rusage. Parses the "RESULT" line; a "SKIP reason" line means not available.
inline ChildResult run_child(const std::vector<std::string>& argv,
                             const std::vector<std::pair<std::string, std::string>>& env) {
  ChildResult result;
  int fds[2];
  if (pipe(fds) != 0) {
    result.failure = std::string("pipe: ") + std::strerror(errno);
    return result;
  }
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    result.failure = std::string("fork: ") + std::strerror(errno);
    return result;
  }
  std::string out;
  char buffer[4096];
  for (ssize_t got; (got = read(fds[0], buffer, sizeof(buffer))) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    out.append(buffer, static_cast<size_t>(got));
  }
  close(fds[0]);
  int status = 0;
  rusage usage{};
  while (wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  result.peak_rss_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux: KiB

  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("SKIP ", 0) == 0) result.failure = line.substr(5);
    if (line.rfind("RESULT", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    for (std::string field; fields >> field;) {
      const size_t eq = field.find('=');
      if (eq != std::string::npos) result.values[field.substr(0, eq)] = field.substr(eq + 1);
    }
  }
  const bool exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  result.ok = exited_ok && !result.values.empty();
  if (!result.ok && result.failure.empty()) {
    result.failure = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                         : "exit status " + std::to_string(WEXITSTATUS(status)) + ", no RESULT line";
  }
  return result;
}

}  // namespace lockstep::bench
