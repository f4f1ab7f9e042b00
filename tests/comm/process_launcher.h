// Starts this test binary again as N rank processes (the way `lockstep run` or torchrun
// would), each running one worker test, and collects how each ended and what it printed.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace lockstep::comm::testing {

struct RankExit {
  int pid = 0;
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal killed it
  std::string output;  // stdout and stderr
};

// Runs `--gtest_filter=<worker_test>` in `ranks` processes with torchrun's variables
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT on a free
// port) plus `env`. Kills them all if they are not done within timeout_s.
std::vector<RankExit> launch_ranks(int ranks, const std::string& worker_test,
                                   const std::map<std::string, std::string>& env, int timeout_s = 120);

// The same for any program: `program args...` in each rank process. while_running(pids),
// if given, runs once they are all started (to kill one mid-run, say).
std::vector<RankExit> launch_program(int ranks, const std::string& program, const std::vector<std::string>& args,
                                     const std::map<std::string, std::string>& env, int timeout_s = 120,
                                     const std::function<void(const std::vector<int>& pids)>& while_running = {});

// "rank 0: exit 0\n<output>..." for failure messages.
std::string describe(const std::vector<RankExit>& exits);

// Names in /dev/shm that start with "lockstep-<pid>-" for any of the pids.
std::vector<std::string> leftover_segments(const std::vector<RankExit>& exits);

// Set in the worker processes: which worker test should run (others skip).
const char* worker_mode();

}  // namespace lockstep::comm::testing
