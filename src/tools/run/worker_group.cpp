#include "tools/run/worker_group.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lockstep/core/error.h"

extern char** environ;

namespace lockstep::tools {
namespace {

constexpr size_t kTailLines = 20;
constexpr size_t kLongestLine = 64 * 1024;

using Clock = std::chrono::steady_clock;

// The keeper: a process of its own that outlives the launcher. It reads the workers' pids
// from a pipe only the launcher writes; when the pipe closes — the launcher is done, or
// was killed, even by SIGKILL — it kills each worker's whole process group, so nothing a
// worker started (a shell's children, a training script's data loaders) outlives the job.
// PR_SET_PDEATHSIG reaches only the workers themselves. Only async-signal-safe calls.
[[noreturn]] void keep(int read_fd) {
  signal(SIGINT, SIG_IGN);  // the terminal's ^C reaches the launcher's group; the launcher decides
  signal(SIGTERM, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  constexpr int kMost = 4096;
  static pid_t groups[kMost];
  int count = 0;
  for (;;) {
    pid_t pid = 0;
    const ssize_t n = read(read_fd, &pid, sizeof(pid));
    if (n == sizeof(pid)) {
      if (count < kMost) groups[count++] = pid;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // end of file: the launcher is gone
  }
  for (int i = 0; i < count; ++i) kill(-groups[i], SIGKILL);
  _exit(0);
}

}  // namespace

std::string WorkerExit::describe() const {
  if (signal != 0) return "killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return "exit code " + std::to_string(exit_code);
}

WorkerGroup::WorkerGroup(const std::vector<WorkerSpec>& specs) : workers_(specs.size()) {
  const pid_t launcher = getpid();
  int keeper_pipe[2];
  LOCKSTEP_CHECK(pipe2(keeper_pipe, O_CLOEXEC) == 0) << "pipe: " << std::strerror(errno);
  keeper_ = fork();
  LOCKSTEP_CHECK(keeper_ >= 0) << "fork: " << std::strerror(errno);
  if (keeper_ == 0) {
    close(keeper_pipe[1]);
    keep(keeper_pipe[0]);
  }
  close(keeper_pipe[0]);
  keeper_fd_ = keeper_pipe[1];  // close-on-exec: no worker holds it open
  for (size_t r = 0; r < specs.size(); ++r) {
    const WorkerSpec& spec = specs[r];
    Worker& w = workers_[r];
    w.exit.rank = spec.rank;
    w.log = std::fopen(spec.log_path.c_str(), "we");  // e: not inherited by the workers
    LOCKSTEP_CHECK(w.log != nullptr) << "cannot write the log " << spec.log_path << ": " << std::strerror(errno);
    int fds[2];
    LOCKSTEP_CHECK(pipe2(fds, O_CLOEXEC) == 0) << "pipe: " << std::strerror(errno);
    // Everything the child needs is built before fork: only async-signal-safe calls after it.
    std::map<std::string, std::string> vars;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const size_t eq = entry.find('=');
      if (eq != std::string::npos) vars[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
    for (const auto& [k, v] : spec.env) vars[k] = v;
    std::vector<std::string> entries;
    for (const auto& [k, v] : vars) entries.push_back(k + "=" + v);
    std::vector<char*> envp, argv;
    for (std::string& s : entries) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> command = spec.command;
    for (std::string& s : command) argv.push_back(s.data());
    argv.push_back(nullptr);

    const pid_t pid = fork();
    LOCKSTEP_CHECK(pid >= 0) << "fork: " << std::strerror(errno);
    if (pid == 0) {
      setpgid(0, 0);  // its own group: stopping the rank stops what it started
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(127);  // the launcher died before prctl
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      execvpe(argv[0], argv.data(), envp.data());
      const char* what = "lockstep run: cannot start the command: ";
      (void)!write(STDERR_FILENO, what, std::strlen(what));
      (void)!write(STDERR_FILENO, argv[0], std::strlen(argv[0]));
      (void)!write(STDERR_FILENO, "\n", 1);
      _exit(127);
    }
    setpgid(pid, pid);  // also from this side, so it holds before the child runs
    (void)!write(keeper_fd_, &pid, sizeof(pid));
    close(fds[1]);
    w.pid = pid;
    w.fd = fds[0];
  }
}

WorkerGroup::~WorkerGroup() {
  signal_all(SIGKILL);
  for (Worker& w : workers_) {
    // Ended workers were left unreaped (zombies), so no other process could take their pid
    // as a process group id before their groups were killed just now.
    if (w.pid > 0) waitpid(w.pid, nullptr, 0);
    if (w.fd >= 0) close(w.fd);
    if (w.log != nullptr) std::fclose(w.log);
  }
  if (keeper_fd_ >= 0) close(keeper_fd_);  // the keeper kills the groups again and leaves
  if (keeper_ > 0) waitpid(keeper_, nullptr, 0);
}

void WorkerGroup::print_line(Worker& w, int rank, std::string line) {
  std::printf("[rank %d] %s\n", rank, line.c_str());
  w.tail.push_back(std::move(line));
  if (w.tail.size() > kTailLines) w.tail.pop_front();
}

void WorkerGroup::relay(Worker& w, int rank, const char* data, size_t n) {
  std::fwrite(data, 1, n, w.log);
  w.partial.append(data, n);
  auto print = [&](size_t start, size_t length) { print_line(w, rank, w.partial.substr(start, length)); };
  size_t start = 0;
  for (size_t nl; (nl = w.partial.find('\n', start)) != std::string::npos; start = nl + 1) print(start, nl - start);
  // Output that never ends a line (binary data, a progress bar drawn with \r) is relayed in
  // pieces: the launcher holds at most one piece per worker.
  for (; w.partial.size() - start > kLongestLine; start += kLongestLine) print(start, kLongestLine);
  w.partial.erase(0, start);
  std::fflush(stdout);
}

// The last line a worker left unended: printed as a line, and kept in the log as it came.
void WorkerGroup::flush_partial(Worker& w, int rank) {
  if (w.partial.empty()) return;
  print_line(w, rank, std::move(w.partial));
  w.partial.clear();
  std::fflush(stdout);
}

int64_t WorkerGroup::pump(int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<size_t> owners;
  for (size_t r = 0; r < workers_.size(); ++r) {
    if (workers_[r].fd < 0) continue;
    fds.push_back({workers_[r].fd, POLLIN, 0});
    owners.push_back(r);
  }
  if (fds.empty()) return -1;
  if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return 0;  // timeout or a signal
  int64_t total = 0;
  char buffer[65536];
  for (size_t i = 0; i < fds.size(); ++i) {
    if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    Worker& w = workers_[owners[i]];
    const ssize_t n = read(w.fd, buffer, sizeof(buffer));
    if (n > 0) {
      relay(w, w.exit.rank, buffer, static_cast<size_t>(n));
      total += n;
    } else if (n == 0 || errno != EINTR) {
      flush_partial(w, w.exit.rank);
      std::fflush(w.log);
      close(w.fd);
      w.fd = -1;
    }
  }
  return total;
}

void WorkerGroup::reap(WorkerExit& first) {
  for (Worker& w : workers_) {
    if (!w.running) continue;
    // WNOWAIT: seen, not reaped, so the pid stays this worker's (see signal_all).
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != w.pid)
      continue;
    w.running = false;
    if (info.si_code == CLD_EXITED) w.exit.exit_code = info.si_status;
    if (info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED) w.exit.signal = info.si_status;
    if (w.exit.ok()) continue;
    if (first.rank < 0) first = w.exit;
    if (!stopping_) early_failures_.push_back(w.exit);
  }
}

void WorkerGroup::signal_all(int signal) {
  // Every group, also of a worker that has ended: what it started may still run. Its pid
  // is still its (a zombie until the destructor), so the group id is not anyone else's.
  for (const Worker& w : workers_) {
    if (w.pid > 0) kill(-w.pid, signal);
  }
}

WorkerExit WorkerGroup::run(const volatile bool& interrupted, const volatile int& stop_signal,
                            std::chrono::milliseconds grace, const RunHooks& hooks) {
  WorkerExit first;
  auto any_running = [&] {
    for (const Worker& w : workers_)
      if (w.running) return true;
    return false;
  };
  Clock::time_point kill_at{};
  Clock::time_point next_check = Clock::now() + std::chrono::seconds(1);
  while (any_running()) {
    pump(50);
    reap(first);
    bool stop_asked = false;
    if (!stopping_ && hooks.check && Clock::now() >= next_check) {
      stop_asked = hooks.check();
      next_check = Clock::now() + std::chrono::seconds(1);
    }
    if (!stopping_ && (first.rank >= 0 || interrupted || stop_asked)) {
      // One failed (or the launcher was told to stop): the others stop too.
      if (hooks.before_stop) {
        hooks.before_stop(first);
        reap(first);  // who else failed meanwhile, of their own accord
      }
      stopping_ = true;
      signal_all(interrupted ? stop_signal : SIGTERM);
      kill_at = Clock::now() + grace;
    }
    if (stopping_ && Clock::now() >= kill_at) signal_all(SIGKILL);
  }
  // What the workers printed last; a pipe something they started still holds open does not
  // keep the launcher waiting.
  while (pump(20) > 0) {
  }
  for (Worker& w : workers_) flush_partial(w, w.exit.rank);
  return first;
}

std::vector<std::string> WorkerGroup::last_lines(int rank) const {
  for (const Worker& w : workers_) {
    if (w.exit.rank == rank) return {w.tail.begin(), w.tail.end()};
  }
  return {};
}

}  // namespace lockstep::tools
