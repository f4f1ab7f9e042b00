// The processes `lockstep run` starts: one per rank, each the leader of its own process
// group (so stopping a rank stops whatever it started), killed if the launcher dies
// (PR_SET_PDEATHSIG for the worker, and a keeper process that kills each worker's whole
// group once the launcher is gone, even by SIGKILL), its stdout and stderr read through one
// pipe. The launcher prints
// every line prefixed by its rank, keeps the whole output in a log file per rank and the
// last lines in memory for the failure summary.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace lockstep::tools {

struct WorkerSpec {
  int rank = 0;                            // the job's rank: names the worker's lines and its exit
  std::vector<std::string> command;        // argv; argv[0] is looked up on PATH
  std::map<std::string, std::string> env;  // set on top of the launcher's environment
  std::string log_path;                    // this rank's whole output
};

// How a worker ended.
struct WorkerExit {
  int rank = -1;       // the spec's rank
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  bool ok() const { return signal == 0 && exit_code == 0; }
  std::string describe() const;  // "exit code 3", "killed by signal 9 (Killed)"
};

// What the launcher adds to a group's run.
struct RunHooks {
  // Polled about once a second while workers run; true stops the group as a failure does.
  std::function<bool()> check;
  // Called once when the group starts to stop (a worker failed, the launcher was signalled,
  // or check() said so), before any worker is signalled; `first` is the failure, if any.
  std::function<void(const WorkerExit& first)> before_stop;
};

class WorkerGroup {
 public:
  // Starts every worker; throws Error naming the command when one cannot start.
  explicit WorkerGroup(const std::vector<WorkerSpec>& specs);
  ~WorkerGroup();  // stops what still runs (SIGKILL)
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Relays output and reaps workers until all have ended, or until one fails, `interrupted`
  // becomes true (a signal to the launcher) or hooks.check() says to stop; then sends
  // `stop_signal` (SIGTERM unless interrupted) to every group still running and, after
  // `grace`, SIGKILL. Returns the first failure (in time), or a WorkerExit with rank -1 when
  // no worker failed.
  WorkerExit run(const volatile bool& interrupted, const volatile int& stop_signal, std::chrono::milliseconds grace,
                 const RunHooks& hooks = {});

  // Every worker that failed before the group was told to stop, in the order seen: the
  // first is not always the cause (a rank whose collective failed when its peer gave up can
  // exit before that peer has).
  const std::vector<WorkerExit>& early_failures() const { return early_failures_; }

  // The last lines worker `rank` printed (at most `count`).
  std::vector<std::string> last_lines(int rank) const;

 private:
  struct Worker {
    pid_t pid = -1;
    int fd = -1;  // read end of its output pipe; -1 once closed
    FILE* log = nullptr;
    std::string partial;  // a line not yet ended
    std::deque<std::string> tail;
    bool running = true;
    WorkerExit exit;
  };
  void print_line(Worker& w, int rank, std::string line);  // "[rank r] line", kept in the tail
  void relay(Worker& w, int rank, const char* data, size_t n);
  void flush_partial(Worker& w, int rank);
  int64_t pump(int timeout_ms);  // relays what is ready: bytes read, -1 when every pipe is closed
  void reap(WorkerExit& first);  // collects ended workers
  void signal_all(int signal);

  std::vector<Worker> workers_;
  std::vector<WorkerExit> early_failures_;
  bool stopping_ = false;  // the stop signals have gone out
  pid_t keeper_ = -1;      // kills the workers' groups when keeper_fd_ closes
  int keeper_fd_ = -1;     // the write end of its pipe of pids
};

}  // namespace lockstep::tools
