// `lockstep run`: one process per device for any program, torchrun's contract.
//
//   lockstep run -n 2 [--gpus auto|0,2,3] [--min-free-memory 10G] [--log-dir DIR]
//                [--max-restarts K] [--grace SECONDS] [--hang-timeout 5m]
//                [--nnodes N --node-rank R --master-addr HOST [--master-port P]] -- CMD ARGS...
//
// Each worker gets torchrun's variables: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK, GROUP_WORLD_SIZE, ROLE_*, TORCHELASTIC_* (with an error file whose error the
// failure summary shows), MASTER_ADDR and MASTER_PORT (a free port, fresh for every start,
// unless --master-port; with --nnodes the launchers of the nodes meet as node_group.h says), and
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
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "lockstep/comm/job_secret.h"
#include "lockstep/comm/launch_env.h"
#include "lockstep/core/device.h"
#include "lockstep/core/error.h"
#include "lockstep/gpu/gpu_selection.h"
#include "tools/common/byte_size.h"
#include "tools/common/commands.h"
#include "tools/common/duration.h"
#include "tools/common/error_file.h"
#include "tools/common/flags.h"
#include "tools/common/path_lookup.h"
#include "tools/common/run_dir.h"
#include "tools/run/hang_verdict.h"
#include "tools/run/lost_peer.h"
#include "tools/run/node_group.h"
#include "tools/run/ramp.h"
#include "tools/run/run_gpus.h"
#include "tools/run/slurm_hostlist.h"
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
      {"GROUP_RANK", std::to_string(info.rank / std::max(1, info.local_world_size))},
      // The rest of torchrun 1.13+'s own (Lightning and PyTorch's examples read them).
      {"GROUP_WORLD_SIZE",
       std::to_string((info.world_size + std::max(1, info.local_world_size) - 1) / std::max(1, info.local_world_size))},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", std::to_string(info.rank)},
      {"ROLE_WORLD_SIZE", std::to_string(info.world_size)}};
  if (!info.master_addr.empty()) vars["MASTER_ADDR"] = info.master_addr;
  if (info.master_port > 0) vars["MASTER_PORT"] = std::to_string(info.master_port);
  return vars;
}

// A port for the job's rendezvous that every rank derives alike from the job id (FNV-1a),
// in 29500 .. 39499: two jobs on one host rarely meet at one.
int port_of_job(const std::string& job_id) {
  uint64_t hash = 14695981039346656037ull;
  for (const unsigned char c : job_id) hash = (hash ^ c) * 1099511628211ull;
  return 29500 + static_cast<int>(hash % 10000);
}

// Under mpirun or srun: this process is one rank already. The command runs in its place
// with torchrun's variables, MASTER_ADDR and MASTER_PORT included (PyTorch's env:// needs
// them): --master-addr, else the environment's, else loopback for a job on one host or, under
// Slurm, the first host of the step's nodes; and a port from --master-port or the job id.
// mpirun's variables do not say where rank 0 runs across hosts, and asking its PMIx server
// (here, or in a child) makes the command's own MPI_Init fail: the user names the host.
[[noreturn]] void exec_as_rank(comm::LaunchInfo info, const std::vector<std::string>& command,
                               const std::string& master_addr, int master_port) {
  if (!master_addr.empty()) info.master_addr = master_addr;
  if (info.master_addr.empty()) {
    if (info.local_world_size == info.world_size) {
      info.master_addr = "127.0.0.1";
    } else if (info.launcher == "slurm") {
      const char* name = std::getenv("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
      if (const char* list = std::getenv(name)) info.master_addr = first_slurm_host(list, name);
    } else if (info.rank == 0) {
      std::fprintf(stderr,
                   "lockstep run: mpirun does not say where rank 0 runs, so MASTER_ADDR is not set; for a "
                   "PyTorch env:// job across hosts give it (lockstep run --master-addr <rank 0's host>)\n");
    }
  }
  if (master_port > 0) info.master_port = master_port;
  if (info.master_port == 0) info.master_port = port_of_job(info.job_id);
  for (const auto& [name, value] : torchrun_variables(info)) setenv(name.c_str(), value.c_str(), 1);
  std::vector<char*> argv;
  std::vector<std::string> copy = command;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  LOCKSTEP_FAIL() << "cannot start " << command[0] << ": " << std::strerror(errno);
  std::abort();
}

// Whether a failed rank's failure followed another's: its flight record holds a
// communication error (its collective failed when a peer gave up), or its error file says
// that a connection to a peer was lost (a PyTorch rank's gloo or NCCL error).
bool followed_a_peer(const WorkerExit& e, const std::vector<std::optional<comm::FlightReport>>& reports,
                     const std::vector<WorkerSpec>& specs, int first_rank) {
  const size_t index = static_cast<size_t>(e.rank - first_rank);
  if (index < reports.size() && reports[index] && !reports[index]->failure.empty()) return true;
  return index < specs.size() && reports_a_lost_peer(read_error_file(specs[index].env.at(kErrorFileVariable)).message);
}

// The failure to name: the first seen, unless it followed a peer's and a rank that failed of
// its own accord (an exception of its own code, a signal) came after it.
WorkerExit cause_of(const std::vector<WorkerExit>& failures,
                    const std::vector<std::optional<comm::FlightReport>>& reports, const std::vector<WorkerSpec>& specs,
                    const WorkerExit& first, int first_rank) {
  auto of_its_own = [&](const WorkerExit& e) { return !followed_a_peer(e, reports, specs, first_rank); };
  if (of_its_own(first)) return first;
  for (const WorkerExit& e : failures) {
    if (of_its_own(e)) return e;
  }
  return first;
}

// One job's settings, from the flags.
struct RunOptions {
  std::vector<std::string> command;
  int64_t workers = 0;  // on this node
  int64_t nodes = 1, node_rank = 0;
  int64_t max_restarts = 0, master_port = 0;
  double grace_seconds = 5, hang_seconds = 0;
  std::string log_dir, master_addr = "127.0.0.1", run_id, hang_timeout;
  std::chrono::milliseconds join_timeout{std::chrono::minutes(5)};
  double stop_after_seconds = 0;  // > 0: the ramp's clock stops the workers then, not a failure
  bool sample_gpus = false;       // the ramp's figure when the program prints none
  int first_rank() const { return static_cast<int>(node_rank * workers); }
  int world_size() const { return static_cast<int>(nodes * workers); }
};

// How one attempt of the group ended.
struct Attempt {
  bool failed = false;
  int code = 0;                             // the launcher's exit code if it ends here
  bool timed = false;                       // stopped after o.stop_after_seconds, no worker having failed
  std::optional<double> gpu_utilization{};  // the mean over the workers' GPUs while they ran, percent
};

// Prints what failed: the rank (or the hang), where the ranks were, its last lines, its
// error file and its log.
void report_failure(const RunOptions& o, const WorkerGroup& group, const std::vector<WorkerSpec>& specs,
                    const WorkerExit& failure, const WorkerExit& blamed, bool hung, const std::string& verdict,
                    const std::string& flight_dir) {
  if (hung) {
    std::fprintf(stderr, "lockstep run: no rank has made progress for %g s (--hang-timeout); the group was stopped\n",
                 o.hang_seconds);
  } else {
    const std::string followed =
        blamed.rank == failure.rank ? "" : ", and rank " + std::to_string(failure.rank) + "'s failure followed";
    std::fprintf(stderr, "lockstep run: rank %d failed %s(%s)%s; the other ranks were stopped\n", blamed.rank,
                 followed.empty() ? "first " : "", blamed.describe().c_str(), followed.c_str());
  }
  if (!verdict.empty())
    std::fprintf(stderr, "  where: %s\n  flight records: %s\n", verdict.c_str(), flight_dir.c_str());
  if (hung) return;
  const WorkerSpec& spec = specs[static_cast<size_t>(blamed.rank - o.first_rank())];
  const WorkerError error = read_error_file(spec.env.at(kErrorFileVariable));
  if (!error.message.empty()) {
    std::fprintf(stderr, "  its error: %s\n", error.message.c_str());
  } else if (const std::vector<std::string> tail = group.last_lines(blamed.rank); !tail.empty()) {
    std::fprintf(stderr, "  its last lines:\n");
    for (const std::string& line : tail) std::fprintf(stderr, "    %s\n", line.c_str());
  }
  std::fprintf(stderr, "  its whole output: %s\n", spec.log_path.c_str());
}

// What names the logs, flight records and error files of an attempt: a restart keeps those
// of the attempt that failed.
std::string attempt_suffix(int64_t attempt) { return attempt == 0 ? "" : ".restart" + std::to_string(attempt); }

// The workers of this node for one attempt: torchrun's variables, the job's secret, logs,
// flight records and error files under the log folder.
std::vector<WorkerSpec> worker_specs(const RunOptions& o, int64_t attempt, int port, const std::string& secret,
                                     const std::string& threads, const GpuAssignment& assigned,
                                     const std::string& flight_dir) {
  const std::string suffix = attempt_suffix(attempt);
  std::vector<WorkerSpec> specs;
  for (int64_t r = 0; r < o.workers; ++r) {
    WorkerSpec spec;
    spec.rank = o.first_rank() + static_cast<int>(r);
    spec.command = o.command;
    comm::LaunchInfo info;
    info.rank = spec.rank;
    info.local_rank = static_cast<int>(r);
    info.world_size = o.world_size();
    info.local_world_size = static_cast<int>(o.workers);
    info.master_addr = o.master_addr;
    info.master_port = port;
    spec.env = torchrun_variables(info);
    // torchelastic's (torch.distributed.is_torchelastic_launched() looks for them).
    spec.env["TORCHELASTIC_RUN_ID"] = o.run_id;
    spec.env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(o.max_restarts);
    spec.env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(attempt);
    spec.env["TORCHELASTIC_USE_AGENT_STORE"] = "False";  // rank 0 serves the rendezvous, not the launcher
    const fs::path name = "rank" + std::to_string(spec.rank) + suffix;
    spec.env[kErrorFileVariable] = (fs::path(o.log_dir) / (name.string() + ".error.json")).string();
    spec.env["OMP_NUM_THREADS"] = threads;
    spec.env[comm::kJobSecretVariable] = secret;
    if (!assigned.cuda_visible_devices.empty()) spec.env["CUDA_VISIBLE_DEVICES"] = assigned.cuda_visible_devices;
    spec.env["LOCKSTEP_FLIGHT_DIR"] = flight_dir;
    spec.log_path = (fs::path(o.log_dir) / (name.string() + ".log")).string();
    std::error_code ignored;
    fs::remove(spec.env[kErrorFileVariable], ignored);  // an earlier job's, in a reused --log-dir
    specs.push_back(std::move(spec));
  }
  return specs;
}

// One start of this node's workers, until they end, fail, hang, or another node fails.
Attempt run_attempt(const RunOptions& o, int64_t attempt, const std::string& secret, const std::string& threads,
                    const GpuAssignment& assigned, NodeGroup* nodes) {
  const int port = o.master_port > 0 ? static_cast<int>(o.master_port) : free_port();
  const std::string flight_dir = (fs::path(o.log_dir) / ("flight" + attempt_suffix(attempt))).string();
  std::error_code flight_error;
  fs::remove_all(flight_dir, flight_error);  // an earlier job's records in a reused --log-dir
  fs::create_directories(flight_dir, flight_error);
  if (flight_error)
    throw Error("--log-dir " + o.log_dir + ": cannot create " + flight_dir + ": " + flight_error.message());
  const std::vector<WorkerSpec> specs = worker_specs(o, attempt, port, secret, threads, assigned, flight_dir);
  if (nodes != nullptr) nodes->join(attempt);
  WorkerGroup group(specs);
  const int workers = static_cast<int>(o.workers);
  const auto started = std::chrono::steady_clock::now();
  GpuUtilization utilization(o.sample_gpus ? assigned.indices : std::vector<unsigned>{});
  bool hung = false, timed = false;
  std::string elsewhere;                                   // another node's failure
  std::vector<std::optional<comm::FlightReport>> reports;  // as the group was before it was stopped
  RunHooks hooks;
  hooks.check = [&] {
    if (g_verdict_asked) {
      g_verdict_asked = 0;
      const std::string now = hang_verdict(read_flight_reports(flight_dir, o.first_rank(), workers), -1, "",
                                           comm::unix_ms_now(), o.first_rank());
      std::fprintf(stderr, "lockstep run: %s\n", now.empty() ? "no rank has written a flight record" : now.c_str());
    }
    if (nodes != nullptr && !(elsewhere = nodes->check(attempt)).empty()) return true;
    utilization.sample();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (o.stop_after_seconds > 0 && seconds >= o.stop_after_seconds) return timed = true;
    if (o.hang_seconds <= 0) return false;
    // Only ranks that keep a record can be judged: a job of other programs never hangs here.
    const int64_t progress = newest_progress_ms(read_flight_reports(flight_dir, o.first_rank(), workers));
    hung = progress > 0 && static_cast<double>(comm::unix_ms_now() - progress) > o.hang_seconds * 1e3;
    return hung;
  };
  // Tells the other nodes what failed here, once.
  bool nodes_told = false;
  auto tell_nodes = [&](const std::string& what) {
    if (nodes == nullptr || nodes_told) return;
    nodes->fail(attempt, "node " + std::to_string(o.node_rank) + ": " + what);
    nodes_told = true;
  };
  hooks.before_stop = [&](const WorkerExit& first) {
    if (first.rank < 0 && !hung) return;  // stopped by a signal to the launcher, or by another node
    if (hung) tell_nodes("no rank has made progress for " + o.hang_timeout);
    // The survivors' records catch up with the failure (they are written five times a second).
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    reports = read_flight_reports(flight_dir, o.first_rank(), workers);
    // A rank that lost a peer is not the cause: the other nodes hear once the group has
    // stopped and the rank that started it is known.
    if (!hung && !followed_a_peer(first, reports, specs, o.first_rank()))
      tell_nodes("rank " + std::to_string(first.rank) + " failed (" + first.describe() + ")");
  };
  const WorkerExit failure = group.run(g_interrupted, g_stop_signal,
                                       std::chrono::milliseconds(static_cast<int64_t>(o.grace_seconds * 1e3)), hooks);
  if (g_interrupted) {
    std::fprintf(stderr, "lockstep run: stopped by signal %d; every worker was stopped\n", g_stop_signal);
    if (nodes != nullptr) nodes->fail(attempt, "node " + std::to_string(o.node_rank) + "'s launcher was stopped");
    return {.failed = true, .code = 128 + g_stop_signal};
  }
  if (!elsewhere.empty()) {
    std::fprintf(stderr, "lockstep run: %s; this node's workers were stopped\n", elsewhere.c_str());
    nodes->finish(attempt, false);
    return {.failed = true, .code = 1};
  }
  if (timed && group.early_failures().empty()) {
    return {.timed = true, .gpu_utilization = utilization.mean()};
  }
  if (failure.rank < 0 && !hung) {
    // Every node's workers end this attempt: wait for the others, and learn how they ended.
    if (const std::string other = nodes != nullptr ? nodes->finish(attempt, true) : ""; !other.empty()) {
      std::fprintf(stderr, "lockstep run: %s\n", other.c_str());
      return {.failed = true, .code = 1};
    }
    return {.gpu_utilization = utilization.mean()};
  }
  const WorkerExit blamed = cause_of(group.early_failures(), reports, specs, failure, o.first_rank());
  if (!hung) tell_nodes("rank " + std::to_string(blamed.rank) + " failed (" + blamed.describe() + ")");
  const std::string verdict = hang_verdict(reports, hung ? -1 : blamed.rank, hung ? "" : blamed.describe(),
                                           comm::unix_ms_now(), o.first_rank());
  report_failure(o, group, specs, failure, blamed, hung, verdict, flight_dir);
  if (nodes != nullptr) nodes->finish(attempt, false);
  // A hang ends with timeout(1)'s code.
  return {.failed = true, .code = hung ? 124 : blamed.signal != 0 ? 128 + blamed.signal : blamed.exit_code};
}

// The OpenMP threads each of `workers` workers gets: OMP_NUM_THREADS, else the cores shared.
std::string threads_per_worker(int64_t workers) {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  return omp != nullptr ? omp : std::to_string(std::max<int64_t>(1, host_cores() / std::max<int64_t>(1, workers)));
}

// The workers' GPUs (run_gpus.h), each rank's printed from `first_rank` on.
GpuAssignment assign_and_show_gpus(const GpuAsk& ask, int first_rank) {
  GpuAssignment assigned = assign_gpus(ask, g_interrupted);
  if (!assigned.notice.empty()) std::fprintf(stderr, "lockstep run: %s\n", assigned.notice.c_str());
  for (size_t r = 0; r < assigned.per_rank.size(); ++r)
    std::fprintf(stderr, "lockstep run: rank %zu on %s\n", first_rank + r, assigned.per_rank[r].c_str());
  return assigned;
}

// What --ramp asks for.
struct RampOptions {
  std::vector<int> scales;
  std::string metric;   // --ramp-metric, or ""
  double seconds = -1;  // --ramp-seconds; < 0: not given
};

// --ramp: the command with each worker count in turn (ramp.h), each in a folder of its own
// under the log folder; the table when every scale has run, or at the first that fails.
int run_ramp(const RunOptions& o, const RampOptions& ramp, GpuAsk ask) {
  std::error_code ignored;
  const bool train = is_lockstep_train(o.command, fs::read_symlink("/proc/self/exe", ignored).string());
  const std::string given_out = train ? out_dir_of(o.command) : "";
  // lockstep train's figures and weights need its whole run; other programs get a minute.
  const double seconds = ramp.seconds >= 0 ? ramp.seconds : train ? 0 : 60;
  const std::string gpus = ask.gpus;
  std::vector<RampScale> rows;
  for (const int workers : ramp.scales) {
    const std::string name = "workers-" + std::to_string(workers);
    RunOptions scale = o;
    scale.workers = workers;
    scale.stop_after_seconds = seconds;
    scale.sample_gpus = !train && ramp.metric.empty();
    scale.log_dir = (fs::path(o.log_dir) / name).string();
    std::error_code log_dir_error;
    fs::create_directories(scale.log_dir, log_dir_error);
    if (log_dir_error) throw Error("the ramp's log folder " + scale.log_dir + ": " + log_dir_error.message());
    const std::string out = given_out.empty() ? scale.log_dir + "/out" : (fs::path(given_out) / name).string();
    if (train) scale.command = with_out_dir(o.command, out);
    std::fprintf(stderr, "lockstep run: ramp: %d worker%s", workers, workers == 1 ? "" : "s");
    if (seconds > 0) std::fprintf(stderr, ", for %g s", seconds);
    std::fprintf(stderr, "\n");
    ask.workers = workers;
    ask.gpus = ramp_gpus(gpus, workers, ramp.scales.back());
    const GpuAssignment assigned = assign_and_show_gpus(ask, 0);
    const Attempt outcome =
        run_attempt(scale, 0, comm::make_job_secret(), threads_per_worker(workers), assigned, nullptr);
    if (g_interrupted) return outcome.code;
    RampScale row;
    row.workers = workers;
    row.failed = outcome.failed;
    row.timed = outcome.timed;
    if (train) {
      read_train_figures(out, row);
    } else if (!ramp.metric.empty()) {
      std::ifstream log(fs::path(scale.log_dir) / "rank0.log");
      const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      row.throughput = metric_in_output(text, ramp.metric);
      row.source = row.throughput ? "rank 0's output (--ramp-metric)" : "--ramp-metric matched nothing rank 0 printed";
    } else if (outcome.gpu_utilization) {
      row.throughput = *outcome.gpu_utilization * workers;
      row.source = "GPU utilization: mean percent x GPUs (no --ramp-metric)";
    } else {
      row.source = "no figure: give --ramp-metric (and no GPU utilization to read)";
    }
    rows.push_back(row);
    if (row.failed) {
      std::printf("%s", ramp_table(rows).c_str());
      std::fprintf(stderr, "lockstep run: the ramp stopped at %d workers, which failed (above); logs: %s\n", workers,
                   scale.log_dir.c_str());
      return outcome.code;
    }
  }
  std::printf("%s", ramp_table(rows).c_str());
  return first_scale_with_other_weights(rows) >= 0 ? 1 : 0;
}

// The command must be there to run, on PATH or as a path.
void check_runnable(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (!find_on_path(path != nullptr ? path : "", program).empty()) return;
  if (program.find('/') != std::string::npos) throw UsageError("cannot run '" + program + "': no such executable file");
  throw UsageError("cannot find '" + program + "' on PATH");
}

}  // namespace

int run_main(const std::vector<std::string>& args) {
  // Options, then the command: after "--", or from the first word that is not an option.
  RunOptions o;
  std::vector<std::string> options;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (args[i].rfind("-", 0) != 0) {
      o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    // torchrun's and mpirun's spellings.
    static const std::map<std::string, std::string> kAliases = {{"-n", "--nproc"},
                                                                {"-np", "--nproc"},
                                                                {"--nproc-per-node", "--nproc"},
                                                                {"--nproc_per_node", "--nproc"},
                                                                {"--node_rank", "--node-rank"},
                                                                {"--master_addr", "--master-addr"},
                                                                {"--master_port", "--master-port"},
                                                                {"--max_restarts", "--max-restarts"},
                                                                {"--rdzv-id", "--run-id"},
                                                                {"--rdzv_id", "--run-id"}};
    const std::string name = args[i].substr(0, args[i].find('='));
    const auto alias = kAliases.find(name);
    options.push_back(alias == kAliases.end() ? args[i] : alias->second + args[i].substr(name.size()));
    // Every option but --help takes a value, after '=' or as the next word.
    const bool help = args[i] == "--help" || args[i] == "-h";
    if (!help && args[i].find('=') == std::string::npos && i + 1 < args.size()) options.push_back(args[++i]);
  }
  double wait_seconds = -1;
  std::string gpus, min_free_memory = "0", join_timeout, ramp_list;
  RampOptions ramp;
  Flags flags("lockstep run",
              "Starts one process per device, each with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,\n"
              "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, OMP_NUM_THREADS, TORCHELASTIC_*):\n"
              "  lockstep run -n N [options] -- CMD ARGS...\n"
              "  lockstep run --nnodes 2 --node-rank R --master-addr HOST -n N -- CMD ARGS...   (on each node)\n"
              "Output lines carry their rank; a failed worker stops the others, on every node.");
  flags.add("nproc", &o.workers, "workers to start on this node, one per device (-n, --nproc-per-node)");
  flags.add("nnodes", &o.nodes, "nodes of the job, each running its own lockstep run (default 1)");
  flags.add("node-rank", &o.node_rank, "this node's place among them, 0 to nnodes - 1 (ranks follow it)");
  flags.add("log-dir", &o.log_dir, "where each rank's whole output goes (default runs/launch-<timestamp>)");
  flags.add("max-restarts", &o.max_restarts, "restart the whole group this many times after a failure");
  flags.add("grace", &o.grace_seconds, "seconds between SIGTERM and SIGKILL when stopping workers");
  flags.add("hang-timeout", &o.hang_timeout,
            "stop the group, naming the rank that holds it back, when no Lockstep rank has made progress\n"
            "for this long, like 5m (default: never; a collective's own timeout still ends a hang)");
  flags.add("master-addr", &o.master_addr,
            "the address rank 0 serves the rendezvous on (node 0's, with --nnodes; rank 0's host, under\n"
            "mpirun across hosts)");
  flags.add("master-port", &o.master_port,
            "the rendezvous port (default: a free one, fresh for every start; 29500 with --nnodes, whose\n"
            "launchers meet at the port after it)");
  flags.add("run-id", &o.run_id, "the job's id, TORCHELASTIC_RUN_ID (default: made from the address and port)");
  flags.add("join-timeout", &join_timeout, "with --nnodes: how long to wait for every node, like 10m (default 5m)");
  flags.add("gpus", &gpus,
            "'auto' (the freest GPUs no other user holds) or NVML indices like 0,2,3; default auto when the\n"
            "host has a GPU per worker and CUDA_VISIBLE_DEVICES is unset");
  flags.add("min-free-memory", &min_free_memory, "wait until each GPU has this much free, like 10G");
  flags.add("wait", &wait_seconds, "give up waiting for free GPUs after this many seconds (default: wait)");
  flags.add("ramp", &ramp_list,
            "start small, then scale: run the command with each of these worker counts in turn, like\n"
            "1,2,4, stop at the first that fails, and print throughput, speed-up and scaling efficiency");
  flags.add("ramp-seconds", &ramp.seconds,
            "with --ramp: stop each scale after this many seconds (default 60; lockstep train runs to\n"
            "its end, for its figures and weights)");
  flags.add("ramp-metric", &ramp.metric,
            "with --ramp: a regex with one group around the throughput rank 0 prints, like\n"
            "'samples/s=([0-9.]+)' (the mean of its matches after the first); without it: GPU utilization");
  if (!flags.parse(options)) return 0;
  if (o.command.empty()) throw UsageError("no command to run: lockstep run -n N -- CMD ARGS...");
  if (o.grace_seconds < 0) throw UsageError("--grace must be 0 or more seconds");
  if (o.max_restarts < 0) throw UsageError("--max-restarts must be 0 or more");
  if (!o.hang_timeout.empty()) o.hang_seconds = parse_duration("--hang-timeout", o.hang_timeout);
  if (!join_timeout.empty()) {
    o.join_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(parse_duration("--join-timeout", join_timeout) * 1e3));
  }

  const bool ramping = flags.given("ramp");
  if (ramping) {
    ramp.scales = parse_ramp(ramp_list);
    if (flags.given("nproc")) throw UsageError("--ramp " + ramp_list + " gives the worker counts: leave -n out");
    if (flags.given("nnodes")) throw UsageError("--ramp runs on one node: leave --nnodes out");
    if (!ramp.metric.empty()) metric_in_output("", ramp.metric);  // a bad pattern is refused now
    if (ramp.seconds < 0 && flags.given("ramp-seconds"))
      throw UsageError("--ramp-seconds must be 0 (each scale runs until the command ends) or more");
    o.workers = ramp.scales.back();
    ramp_gpus(gpus, o.workers, o.workers);  // a --gpus list too short for the ramp: say so before starting
  } else if (flags.given("ramp-seconds") || flags.given("ramp-metric")) {
    throw UsageError("--ramp-seconds and --ramp-metric go with --ramp COUNTS, like --ramp 1,2,4");
  }

  const comm::LaunchInfo launched = comm::launch_info_from_env();
  if (launched.launcher == "openmpi" || launched.launcher == "slurm") {
    if (ramping) throw UsageError("--ramp starts its own workers: run it outside " + launched.launcher);
    if (flags.given("nproc") && o.workers != launched.world_size) {
      throw UsageError("-n " + std::to_string(o.workers) + " under " + launched.launcher + ", which started " +
                       std::to_string(launched.world_size) + " processes: leave -n out there");
    }
    if (flags.given("master-port") && (o.master_port < 1 || o.master_port > 65535)) {
      throw UsageError("--master-port must be a port number from 1 to 65535, got " + std::to_string(o.master_port));
    }
    exec_as_rank(launched, o.command, flags.given("master-addr") ? o.master_addr : "", static_cast<int>(o.master_port));
  }
  check_runnable(o.command[0]);
  if (!flags.given("nproc") && !ramping && !gpus.empty() && gpus != "auto")
    o.workers = static_cast<int64_t>(gpu::parse_gpu_list(gpus).size());
  // A worker holds pipes and a process: more than a host's fd and process limits allow is
  // a typo, not a job.
  constexpr int64_t kMostWorkers = 1024;
  if (o.workers < 1 || o.workers > kMostWorkers) {
    throw UsageError("-n must be 1 to " + std::to_string(kMostWorkers) + ", got " + std::to_string(o.workers) +
                     " (one worker per device: lockstep run -n 2 -- CMD)");
  }
  if (o.nodes < 1 || o.nodes > kMostWorkers) {
    throw UsageError("--nnodes must be 1 to " + std::to_string(kMostWorkers) + ", got " + std::to_string(o.nodes));
  }
  if (o.node_rank < 0 || o.node_rank >= o.nodes) {
    throw UsageError("--node-rank must be 0 to " + std::to_string(o.nodes - 1) + " (--nnodes " +
                     std::to_string(o.nodes) + "), got " + std::to_string(o.node_rank));
  }
  const bool multi_node = o.nodes > 1;
  if (multi_node && !flags.given("master-addr")) {
    throw UsageError("--nnodes " + std::to_string(o.nodes) +
                     " needs --master-addr: node 0's address, the same on every node");
  }
  if (multi_node && !flags.given("master-port")) o.master_port = 29500;  // torchrun's default
  if (flags.given("master-port") || multi_node) {
    if (o.master_port < 1 || o.master_port > 65534) {
      throw UsageError("--master-port must be a port number from 1 to 65534, got " + std::to_string(o.master_port));
    }
    // Node 0's rank 0 serves there (and node 0's launcher at the next port).
    if (o.node_rank == 0) check_port_free(static_cast<int>(o.master_port));
  }
  if (o.run_id.empty()) {
    o.run_id = multi_node ? "lockstep-" + o.master_addr + "-" + std::to_string(o.master_port)
                          : "lockstep-" + std::to_string(getpid());
  }
  GpuAsk ask;
  ask.gpus = gpus;
  ask.workers = static_cast<int>(o.workers);
  ask.min_free_bytes = parse_byte_size(min_free_memory, "--min-free-memory");
  ask.wait_seconds = wait_seconds;
  {
    std::string line = "lockstep run -n " + std::to_string(o.workers) + " --";
    for (const std::string& word : o.command) line += " " + word;
    const char* user = std::getenv("USER");
    ask.holder = "pid " + std::to_string(getpid()) + " (user " + (user ? user : std::to_string(getuid())) +
                 "): " + line.substr(0, 200);
  }

  if (o.log_dir.empty()) o.log_dir = fresh_run_dir("launch-");
  std::error_code log_dir_error;
  fs::create_directories(o.log_dir, log_dir_error);
  if (log_dir_error) throw Error("--log-dir " + o.log_dir + ": cannot create it: " + log_dir_error.message());
  const std::string threads = threads_per_worker(o.workers);

  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGHUP, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);  // Slurm's --signal: the workers checkpoint and stop
  action.sa_handler = on_verdict_signal;
  sigaction(SIGUSR2, &action, nullptr);

  if (ramping) return run_ramp(o, ramp, ask);
  const GpuAssignment assigned = assign_and_show_gpus(ask, o.first_rank());

  // The job's secret (comm/job_secret.h): only its own workers can use its rendezvous. One
  // given in the environment is kept; the nodes of a job started by hand derive the same one
  // from the user's key (a shared home) and node 0's address.
  const char* given_secret = std::getenv(comm::kJobSecretVariable);
  std::string secret;
  if (given_secret != nullptr && *given_secret != '\0') {
    secret = given_secret;
  } else if (multi_node) {
    comm::LaunchInfo job;
    job.launcher = "lockstep run";
    job.job_id = o.run_id;
    job.master_addr = o.master_addr;
    job.master_port = static_cast<int>(o.master_port);
    secret = comm::to_hex(comm::job_secret(job));
  } else {
    secret = comm::make_job_secret();
  }
  std::unique_ptr<NodeGroup> nodes;
  if (multi_node) {
    setenv(comm::kJobSecretVariable, secret.c_str(), 1);  // job_secret() below reads it
    nodes = std::make_unique<NodeGroup>(static_cast<int>(o.nodes), static_cast<int>(o.node_rank), o.master_addr,
                                        static_cast<int>(o.master_port), comm::job_secret(comm::LaunchInfo{}),
                                        o.join_timeout);
  }
  for (int64_t attempt = 0;; ++attempt) {
    const Attempt outcome = run_attempt(o, attempt, secret, threads, assigned, nodes.get());
    if (!outcome.failed) return 0;
    if (g_interrupted || attempt >= o.max_restarts) return outcome.code;
    std::fprintf(stderr, "lockstep run: restarting the group (%lld of %lld)\n", static_cast<long long>(attempt + 1),
                 static_cast<long long>(o.max_restarts));
  }
}

}  // namespace lockstep::tools
