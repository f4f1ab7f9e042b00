// `lockstep run`: one process per device for any program, torchrun's contract.
//
//   lockstep run -n 2 [--gpus auto|0,2,3] [--min-free-memory 10G] [--log-dir DIR]
//                [--max-restarts K] [--grace SECONDS] [--hang-timeout 5m] -- CMD ARGS...
//
// Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR
// and MASTER_PORT (a free port, fresh for every start, unless --master-port), and
// OMP_NUM_THREADS = cores / N unless it is set. On a host with GPUs each worker sees the
// job's GPUs through CUDA_VISIBLE_DEVICES, ordered so that LOCAL_RANK r's GPU is cuda:r
// (run_gpus.h says which GPUs). Output lines are prefixed by rank; each rank's whole output is in
// DIR/rank<r>.log (DIR/rank<r>.restart<k>.log after the k-th restart). If a worker fails, the others are stopped
// (SIGTERM to each process group, SIGKILL after the grace period) and the summary names the first failure. SIGINT,
// SIGTERM, SIGHUP and SIGUSR1 to the launcher reach every worker; workers die with the launcher. Lockstep workers keep
// flight records (lockstep/comm/flight_recorder.h) in DIR/flight: when a worker fails, or no rank has made progress for
// --hang-timeout, the launcher says which rank holds the others back and where (hang_verdict.h); SIGUSR2 to the
// launcher prints that verdict without stopping anything. Under mpirun or srun
// (their variables present) it starts nothing: it maps their variables to the same contract and runs the command in its
// place.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "lockstep/comm/job_secret.h"
#include "lockstep/comm/launch_env.h"
#include "lockstep/core/device.h"
#include "lockstep/core/error.h"
#include "lockstep/gpu/gpu_selection.h"
#include "tools/common/byte_size.h"
#include "tools/common/commands.h"
#include "tools/common/duration.h"
#include "tools/common/flags.h"
#include "tools/common/run_dir.h"
#include "tools/run/hang_verdict.h"
#include "tools/run/run_gpus.h"
#include "tools/run/worker_group.h"

namespace lockstep::tools {
namespace {

namespace fs = std::filesystem;

volatile bool g_interrupted = false;
volatile int g_stop_signal = SIGTERM;
volatile sig_atomic_t g_verdict_asked = 0;

void on_stop_signal(int signal) {
  g_stop_signal = signal;
  g_interrupted = true;
}

void on_verdict_signal(int) { g_verdict_asked = 1; }

// A TCP port nobody listens on now (the kernel's pick), so two jobs on one host never
// meet at the same fixed port.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  LOCKSTEP_CHECK(fd >= 0) << "socket: " << std::strerror(errno);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  close(fd);
  LOCKSTEP_CHECK(ok) << "cannot find a free port: " << std::strerror(errno);
  return ntohs(address.sin_port);
}

// A port the user chose must be free now: rank 0 would fail to serve on it later, with a
// message far from its cause.
void check_port_free(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  LOCKSTEP_CHECK(fd >= 0) << "socket: " << std::strerror(errno);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  const int error = errno;
  close(fd);
  if (!ok) {
    throw UsageError("--master-port " + std::to_string(port) + " is not free (" + std::strerror(error) +
                     "; another job uses it?): leave --master-port out to get a free port");
  }
}

// torchrun's variables for the rank `info` describes (no address or port when it has none).
std::map<std::string, std::string> torchrun_variables(const comm::LaunchInfo& info) {
  std::map<std::string, std::string> vars = {
      {"RANK", std::to_string(info.rank)},
      {"WORLD_SIZE", std::to_string(info.world_size)},
      {"LOCAL_RANK", std::to_string(info.local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(info.local_world_size)},
      {"GROUP_RANK", std::to_string(info.rank / std::max(1, info.local_world_size))}};
  if (!info.master_addr.empty()) vars["MASTER_ADDR"] = info.master_addr;
  if (info.master_port > 0) vars["MASTER_PORT"] = std::to_string(info.master_port);
  return vars;
}

// Under mpirun or srun: this process is one rank already. The command runs in its place
// with torchrun's variables.
[[noreturn]] void exec_as_rank(const comm::LaunchInfo& info, const std::vector<std::string>& command) {
  for (const auto& [name, value] : torchrun_variables(info)) setenv(name.c_str(), value.c_str(), 1);
  std::vector<char*> argv;
  std::vector<std::string> copy = command;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  LOCKSTEP_FAIL() << "cannot start " << command[0] << ": " << std::strerror(errno);
  std::abort();
}

// The failure to name: the first seen, unless its rank's record holds a communication error
// (its collective failed when a peer gave up) and a rank that failed of its own accord
// (no such error: an exception of its own code, a signal) followed it.
WorkerExit cause_of(const std::vector<WorkerExit>& failures,
                    const std::vector<std::optional<comm::FlightReport>>& reports, const WorkerExit& first) {
  auto of_its_own = [&](const WorkerExit& e) {
    const size_t rank = static_cast<size_t>(e.rank);
    return rank >= reports.size() || !reports[rank] || reports[rank]->failure.empty();
  };
  if (of_its_own(first)) return first;
  for (const WorkerExit& e : failures) {
    if (of_its_own(e)) return e;
  }
  return first;
}

}  // namespace

int run_main(const std::vector<std::string>& args) {
  // Options, then the command: after "--", or from the first word that is not an option.
  std::vector<std::string> options, command;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      command.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (args[i].rfind("-", 0) != 0) {
      command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    // torchrun's and mpirun's spellings of the worker count.
    if (args[i] == "-n" || args[i] == "-np" || args[i] == "--nproc-per-node" || args[i] == "--nproc_per_node") {
      options.push_back("--nproc");
    } else {
      options.push_back(args[i]);
    }
    // Every option but --help takes a value, after '=' or as the next word.
    const bool help = args[i] == "--help" || args[i] == "-h";
    if (!help && args[i].find('=') == std::string::npos && i + 1 < args.size()) options.push_back(args[++i]);
  }
  int64_t workers = 0, max_restarts = 0, master_port = 0;
  double grace_seconds = 5, wait_seconds = -1;
  std::string log_dir, master_addr = "127.0.0.1", gpus, min_free_memory = "0", hang_timeout;
  Flags flags("lockstep run",
              "Starts one process per device, each with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,\n"
              "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, OMP_NUM_THREADS):\n"
              "  lockstep run -n N [options] -- CMD ARGS...\n"
              "Output lines carry their rank; a failed worker stops the others.");
  flags.add("nproc", &workers, "workers to start, one per device (-n, --nproc-per-node)");
  flags.add("log-dir", &log_dir, "where each rank's whole output goes (default runs/launch-<timestamp>)");
  flags.add("max-restarts", &max_restarts, "restart the whole group this many times after a failure");
  flags.add("grace", &grace_seconds, "seconds between SIGTERM and SIGKILL when stopping workers");
  flags.add("hang-timeout", &hang_timeout,
            "stop the group, naming the rank that holds it back, when no Lockstep rank has made progress\n"
            "for this long, like 5m (default: never; a collective's own timeout still ends a hang)");
  flags.add("master-addr", &master_addr, "the address rank 0 serves the rendezvous on");
  flags.add("master-port", &master_port, "the rendezvous port (default: a free one, fresh for every start)");
  flags.add("gpus", &gpus,
            "'auto' (the freest GPUs no other user holds) or NVML indices like 0,2,3; default auto when the\n"
            "host has a GPU per worker and CUDA_VISIBLE_DEVICES is unset");
  flags.add("min-free-memory", &min_free_memory, "wait until each GPU has this much free, like 10G");
  flags.add("wait", &wait_seconds, "give up waiting for free GPUs after this many seconds (default: wait)");
  if (!flags.parse(options)) return 0;
  if (command.empty()) throw UsageError("no command to run: lockstep run -n N -- CMD ARGS...");
  if (grace_seconds < 0) throw UsageError("--grace must be 0 or more seconds");
  if (max_restarts < 0) throw UsageError("--max-restarts must be 0 or more");
  const double hang_seconds = hang_timeout.empty() ? 0 : parse_duration("--hang-timeout", hang_timeout);

  const comm::LaunchInfo launched = comm::launch_info_from_env();
  if (launched.launcher == "openmpi" || launched.launcher == "slurm") {
    if (flags.given("nproc") && workers != launched.world_size) {
      throw UsageError("-n " + std::to_string(workers) + " under " + launched.launcher + ", which started " +
                       std::to_string(launched.world_size) + " processes: leave -n out there");
    }
    exec_as_rank(launched, command);
  }
  if (command[0].find('/') == std::string::npos) {
    bool found = false;
    const char* path = std::getenv("PATH");
    std::string dirs = path != nullptr ? path : "";
    for (size_t start = 0; !found && start <= dirs.size();) {
      const size_t end = std::min(dirs.find(':', start), dirs.size());
      const fs::path candidate = fs::path(dirs.substr(start, end - start)) / command[0];
      found = access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate);
      start = end + 1;
    }
    if (!found) throw UsageError("cannot find '" + command[0] + "' on PATH");
  } else if (access(command[0].c_str(), X_OK) != 0 || fs::is_directory(command[0])) {
    throw UsageError("cannot run '" + command[0] + "': no such executable file");
  }
  if (!flags.given("nproc") && !gpus.empty() && gpus != "auto")
    workers = static_cast<int64_t>(gpu::parse_gpu_list(gpus).size());
  // A worker holds pipes and a process: more than a host's fd and process limits allow is
  // a typo, not a job.
  constexpr int64_t kMostWorkers = 1024;
  if (workers < 1 || workers > kMostWorkers) {
    throw UsageError("-n must be 1 to " + std::to_string(kMostWorkers) + ", got " + std::to_string(workers) +
                     " (one worker per device: lockstep run -n 2 -- CMD)");
  }
  if (flags.given("master-port")) {
    if (master_port < 1 || master_port > 65535) {
      throw UsageError("--master-port must be a port number from 1 to 65535, got " + std::to_string(master_port));
    }
    check_port_free(static_cast<int>(master_port));
  }
  GpuAsk ask;
  ask.gpus = gpus;
  ask.workers = static_cast<int>(workers);
  ask.min_free_bytes = parse_byte_size(min_free_memory, "--min-free-memory");
  ask.wait_seconds = wait_seconds;
  {
    std::string line = "lockstep run -n " + std::to_string(workers) + " --";
    for (const std::string& word : command) line += " " + word;
    const char* user = std::getenv("USER");
    ask.holder = "pid " + std::to_string(getpid()) + " (user " + (user ? user : std::to_string(getuid())) +
                 "): " + line.substr(0, 200);
  }

  if (log_dir.empty()) log_dir = fresh_run_dir("launch-");
  std::error_code log_dir_error;
  fs::create_directories(log_dir, log_dir_error);
  if (log_dir_error) throw Error("--log-dir " + log_dir + ": cannot create it: " + log_dir_error.message());
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const std::string threads =
      omp != nullptr ? omp : std::to_string(std::max<int64_t>(1, host_cores() / std::max<int64_t>(1, workers)));

  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGHUP, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);  // Slurm's --signal: the workers checkpoint and stop
  action.sa_handler = on_verdict_signal;
  sigaction(SIGUSR2, &action, nullptr);

  const GpuAssignment assigned = assign_gpus(ask, g_interrupted);
  if (!assigned.notice.empty()) std::fprintf(stderr, "lockstep run: %s\n", assigned.notice.c_str());
  for (size_t r = 0; r < assigned.per_rank.size(); ++r) {
    std::fprintf(stderr, "lockstep run: rank %zu on %s\n", r, assigned.per_rank[r].c_str());
  }

  // The job's secret (comm/job_secret.h): only its own workers can use its rendezvous. One
  // given in the environment is kept (the same for every node of a job started by hand).
  const char* given_secret = std::getenv(comm::kJobSecretVariable);
  const std::string secret =
      given_secret != nullptr && *given_secret != '\0' ? std::string(given_secret) : comm::make_job_secret();
  for (int64_t attempt = 0;; ++attempt) {
    const int port = master_port > 0 ? static_cast<int>(master_port) : free_port();
    // A restart keeps the logs and flight records of the attempt that failed.
    const std::string attempt_suffix = attempt == 0 ? "" : ".restart" + std::to_string(attempt);
    const std::string flight_dir = (fs::path(log_dir) / ("flight" + attempt_suffix)).string();
    std::error_code flight_error;
    fs::remove_all(flight_dir, flight_error);  // an earlier job's records in a reused --log-dir
    fs::create_directories(flight_dir, flight_error);
    if (flight_error)
      throw Error("--log-dir " + log_dir + ": cannot create " + flight_dir + ": " + flight_error.message());
    std::vector<WorkerSpec> specs;
    for (int64_t r = 0; r < workers; ++r) {
      WorkerSpec spec;
      spec.command = command;
      comm::LaunchInfo info;
      info.rank = info.local_rank = static_cast<int>(r);
      info.world_size = info.local_world_size = static_cast<int>(workers);
      info.master_addr = master_addr;
      info.master_port = port;
      spec.env = torchrun_variables(info);
      spec.env["OMP_NUM_THREADS"] = threads;
      spec.env[comm::kJobSecretVariable] = secret;
      if (!assigned.cuda_visible_devices.empty()) spec.env["CUDA_VISIBLE_DEVICES"] = assigned.cuda_visible_devices;
      spec.env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(attempt);
      spec.env["LOCKSTEP_FLIGHT_DIR"] = flight_dir;
      spec.log_path = (fs::path(log_dir) / ("rank" + std::to_string(r) + attempt_suffix + ".log")).string();
      specs.push_back(std::move(spec));
    }
    WorkerGroup group(specs);
    bool hung = false;
    std::vector<std::optional<comm::FlightReport>> reports;  // as the group was before it was stopped
    RunHooks hooks;
    hooks.check = [&] {
      if (g_verdict_asked) {
        g_verdict_asked = 0;
        const std::string now =
            hang_verdict(read_flight_reports(flight_dir, static_cast<int>(workers)), -1, "", comm::unix_ms_now());
        std::fprintf(stderr, "lockstep run: %s\n", now.empty() ? "no rank has written a flight record" : now.c_str());
      }
      if (hang_seconds <= 0) return false;
      // Only ranks that keep a record can be judged: a job of other programs never hangs here.
      const int64_t progress = newest_progress_ms(read_flight_reports(flight_dir, static_cast<int>(workers)));
      hung = progress > 0 && static_cast<double>(comm::unix_ms_now() - progress) > hang_seconds * 1e3;
      return hung;
    };
    hooks.before_stop = [&](const WorkerExit& first) {
      if (first.rank < 0 && !hung) return;  // stopped by a signal to the launcher
      // The survivors' records catch up with the failure (they are written five times a second).
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      reports = read_flight_reports(flight_dir, static_cast<int>(workers));
    };
    const WorkerExit failure = group.run(g_interrupted, g_stop_signal,
                                         std::chrono::milliseconds(static_cast<int64_t>(grace_seconds * 1e3)), hooks);
    if (g_interrupted) {
      std::fprintf(stderr, "lockstep run: stopped by signal %d; every worker was stopped\n", g_stop_signal);
      return 128 + g_stop_signal;
    }
    if (failure.rank < 0 && !hung) return 0;
    const WorkerExit blamed = cause_of(group.early_failures(), reports, failure);
    const std::string verdict =
        hang_verdict(reports, hung ? -1 : blamed.rank, hung ? "" : blamed.describe(), comm::unix_ms_now());

    if (hung) {
      std::fprintf(stderr, "lockstep run: no rank has made progress for %g s (--hang-timeout); the group was stopped\n",
                   hang_seconds);
    } else {
      const std::string followed =
          blamed.rank == failure.rank ? "" : ", and rank " + std::to_string(failure.rank) + "'s failure followed";
      std::fprintf(stderr, "lockstep run: rank %d failed %s(%s)%s; the other ranks were stopped\n", blamed.rank,
                   followed.empty() ? "first " : "", blamed.describe().c_str(), followed.c_str());
    }
    if (!verdict.empty()) {
      std::fprintf(stderr, "  where: %s\n  flight records: %s\n", verdict.c_str(), flight_dir.c_str());
    }
    if (!hung) {
      const std::vector<std::string> tail = group.last_lines(blamed.rank);
      if (!tail.empty()) {
        std::fprintf(stderr, "  its last lines:\n");
        for (const std::string& line : tail) std::fprintf(stderr, "    %s\n", line.c_str());
      }
      std::fprintf(stderr, "  its whole output: %s\n", specs[static_cast<size_t>(blamed.rank)].log_path.c_str());
    }
    // A hang ends with timeout(1)'s code.
    const int code = hung ? 124 : blamed.signal != 0 ? 128 + blamed.signal : blamed.exit_code;
    if (attempt >= max_restarts) return code;
    std::fprintf(stderr, "lockstep run: restarting the group (%lld of %lld)\n", static_cast<long long>(attempt + 1),
                 static_cast<long long>(max_restarts));
  }
}

}  // namespace lockstep::tools
