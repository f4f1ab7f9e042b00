#include "tools/common/captured_run.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace lockstep::tools {
namespace {

void close_quietly(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

}  // namespace

CapturedRun run_captured(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                         const std::map<std::string, std::string>& extra_env, size_t max_bytes) {
  CapturedRun result;
  if (argv.empty()) {
    result.error = "no program to run";
    return result;
  }
  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    result.error = std::string("pipe: ") + std::strerror(errno);
    return result;
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0 || pipe2(exec_pipe, O_CLOEXEC) != 0) {
    result.error = std::string("pipe: ") + std::strerror(errno);
    close(out_pipe[0]);
    close(out_pipe[1]);
    return result;
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    // Its own process group, so a timeout also ends whatever it started.
    setpgid(0, 0);
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    for (const auto& [name, value] : extra_env) setenv(name.c_str(), value.c_str(), 1);
    execvp(args[0], args.data());
    // The exec pipe (close-on-exec) carries errno only when exec failed.
    const int code = errno;
    (void)!write(exec_pipe[1], &code, sizeof(code));
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_pipe[1]);
  if (pid < 0) {
    result.error = std::string("fork: ") + std::strerror(errno);
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(exec_pipe[0]);
    return result;
  }
  int exec_errno = 0;
  const bool exec_failed = read(exec_pipe[0], &exec_errno, sizeof(exec_errno)) == sizeof(exec_errno);
  close(exec_pipe[0]);

  int fds[2] = {out_pipe[0], err_pipe[0]};
  std::string* sinks[2] = {&result.out, &result.err};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (fds[0] >= 0 || fds[1] >= 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      break;
    }
    pollfd polled[2];
    nfds_t count = 0;
    int which[2];
    for (int i = 0; i < 2; ++i) {
      if (fds[i] < 0) continue;
      polled[count] = {fds[i], POLLIN, 0};
      which[count++] = i;
    }
    const int ready = poll(polled, count, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    for (nfds_t k = 0; k < count; ++k) {
      if ((polled[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buffer[4096];
      const ssize_t n = read(fds[which[k]], buffer, sizeof(buffer));
      if (n <= 0) {
        close_quietly(fds[which[k]]);
        continue;
      }
      std::string& sink = *sinks[which[k]];
      sink.append(buffer, static_cast<size_t>(std::min<size_t>(static_cast<size_t>(n), max_bytes - sink.size())));
    }
  }
  close_quietly(fds[0]);
  close_quietly(fds[1]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (exec_failed) {
    result.error = "cannot run '" + argv[0] + "': " + std::strerror(exec_errno);
    return result;
  }
  result.started = true;
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  // What the program left running in its group goes with it.
  kill(-pid, SIGKILL);
  return result;
}

}  // namespace lockstep::tools
