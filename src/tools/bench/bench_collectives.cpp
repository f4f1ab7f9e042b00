// `lockstep bench collectives`: nccl-tests' table for Lockstep's communicators (size,
// count, type, redop, time, algbw, busbw, #wrong) plus eta, the share of the memory
// bandwidth bound an all-reduce reaches, and a reference in the same run: with --compare
// mpi MPI's own collectives, with --compare nccl NCCL's own reductions beside the tree
// order (the price of the same bits on any GPU count). Ranks are threads (--backend local;
// --backend nccl, one per GPU as nccl-tests' -g) or processes started with mpirun
// (--backend shm or mpi), or launched by the user (e.g. with torchrun, nccl included).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "lockstep/comm/init.h"
#include "lockstep/comm/launch_env.h"
#include "lockstep/comm/local_communicator.h"
#include "lockstep/comm/store.h"
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/device.h"
#include "tools/bench/collective_rows.h"
#include "tools/bench/collective_timing.h"
#include "tools/common/byte_size.h"
#include "tools/common/commands.h"
#include "tools/common/flags.h"

#if LOCKSTEP_HAVE_NCCL
#include "lockstep/comm/cuda/nccl_communicator.h"
#endif

extern char** environ;

namespace lockstep::tools {
namespace {

struct Options {
  std::string minbytes = "4K";
  std::string maxbytes = "64M";
  int64_t stepfactor = 2;
  int64_t iters = 20;
  int64_t warmup = 5;
  int64_t check = 1;
  std::string collective = "all";
  std::string datatype = "f32";
  std::string op = "sum";
  std::string backend = "local";
  int64_t ranks = 0;
  std::string compare;
  bool json = false;
  std::string update_bytes = "64M";
  bool mpi_reference_only = false;  // internal: the MPI half of a local run's comparison
  std::string route;                // how the backend's all-reduce goes, where it layers hosts
};

// A size flag (tools/common/byte_size.h: 4096, 4K, 256M, 1GiB): more than 0 where `positive`.
int64_t parse_bytes(const std::string& text, const std::string& flag, bool positive = false) {
  const auto bytes = static_cast<int64_t>(parse_byte_size(text, "--" + flag));
  if (positive && bytes == 0) throw UsageError("--" + flag + " must be more than 0 bytes, got '" + text + "'");
  return bytes;
}

// nccl-tests' short flags, so its command lines carry over.
std::vector<std::string> expand_short_flags(const std::vector<std::string>& args) {
  static const std::map<std::string, std::string> aliases = {
      {"-b", "--minbytes"}, {"-e", "--maxbytes"}, {"-f", "--stepfactor"}, {"-n", "--iters"}, {"-w", "--warmup_iters"},
      {"-c", "--check"},    {"-o", "--op"},       {"-d", "--datatype"},   {"-g", "--ranks"}};
  std::vector<std::string> out;
  for (const std::string& arg : args) {
    auto it = aliases.find(arg);
    out.push_back(it == aliases.end() ? arg : it->second);
  }
  return out;
}

std::vector<Collective> collectives_of(const std::string& list) {
  if (list == "all") {
    return {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather, Collective::broadcast};
  }
  std::vector<Collective> out;
  std::stringstream in(list);
  for (std::string name; std::getline(in, name, ',');) out.push_back(parse_collective(name));
  return out;
}

std::vector<int64_t> sizes_of(const Options& o, int ranks) {
  const int64_t lo = parse_bytes(o.minbytes, "minbytes");
  const int64_t hi = parse_bytes(o.maxbytes, "maxbytes");
  if (o.stepfactor < 2) throw UsageError("--stepfactor must be at least 2, got " + std::to_string(o.stepfactor));
  if (lo > hi) throw UsageError("--minbytes (" + o.minbytes + ") is above --maxbytes (" + o.maxbytes + ")");
  std::vector<int64_t> sizes;
  // Sizes divisible by ranks x element, so every rank's slice is whole (as nccl-tests).
  const int64_t unit = 8 * ranks;
  for (int64_t s = std::max<int64_t>(lo, 1); s <= hi; s *= o.stepfactor)
    sizes.push_back(std::max(unit, s / unit * unit));
  return sizes;
}

TimingSettings settings_of(const Options& o) {
  TimingSettings s;
  s.iters = o.iters;
  s.warmup = o.warmup;
  s.check = o.check == 1;
  s.dtype = parse_dtype(o.datatype);
  s.op = comm::parse_reduce_op(o.op);
  return s;
}

// Every rank runs this, its buffers on `device`; rank 0's rows come back. comm null: MPI's
// collectives alone (the MPI half of a local run's comparison), with no B_update. B_update
// is host memory's bound, so GPUs have none.
std::vector<Row> measure(comm::Communicator* comm, const Options& o, int ranks, bool with_mpi, double* update_bw,
                         Device device = Device::cpu()) {
  const TimingSettings settings = settings_of(o);
  *update_bw = comm && device.is_cpu()
                   ? update_bandwidth(*comm, parse_bytes(o.update_bytes, "update-bytes", true), settings)
                   : 0;
  std::vector<Row> rows;
  for (Collective what : collectives_of(o.collective)) {
    for (int64_t bytes : sizes_of(o, ranks)) {
      Row row;
      row.what = what;
      row.bytes = bytes;
      if (comm) row.ours = time_collective(*comm, what, bytes, settings, device);
      if (with_mpi) row.reference_seconds = time_mpi_collective(what, bytes, settings);
      rows.push_back(row);
    }
  }
  return rows;
}

RowSettings row_settings(const Options& o, int ranks, double update_bw) {
  return RowSettings{.backend = o.backend,
                     .route = o.route,
                     .ranks = ranks,
                     .dtype = parse_dtype(o.datatype),
                     .op = o.op,
                     .iters = o.iters,
                     .warmup = o.warmup,
                     .reference = o.compare,
                     .update_bandwidth = update_bw};
}

void print_rows(const std::vector<Row>& rows, const Options& o, int ranks, double update_bw) {
  const RowSettings settings = row_settings(o, ranks, update_bw);
  if (o.json) {
    for (const Row& row : rows) std::printf("%s\n", row_json(row, settings).dump().c_str());
  } else {
    std::fputs(rows_table(rows, settings).c_str(), stdout);
  }
  std::fflush(stdout);
}

// ---- processes: started with mpirun, which both process backends can run under ----

bool inside_launched_job() {
  return std::getenv("RANK") || std::getenv("OMPI_COMM_WORLD_RANK") || std::getenv("PMI_RANK");
}

// Runs argv with mpirun on `ranks` processes; returns its exit code, and its stdout when
// capture is set (else it goes to ours).
int run_under_mpirun(int ranks, const std::vector<std::string>& args, std::string* captured) {
  std::vector<std::string> argv = {"mpirun", "-np", std::to_string(ranks), "--oversubscribe"};
  argv.push_back(std::filesystem::read_symlink("/proc/self/exe"));
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  if (geteuid() == 0) {  // OpenMPI refuses root unless told twice
    env_strings.emplace_back("OMPI_ALLOW_RUN_AS_ROOT=1");
    env_strings.emplace_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  }
  std::vector<char*> argv_c, env_c;
  for (auto& s : argv) argv_c.push_back(s.data());
  argv_c.push_back(nullptr);
  for (auto& s : env_strings) env_c.push_back(s.data());
  env_c.push_back(nullptr);

  int pipe_fds[2] = {-1, -1};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (captured) {
    LOCKSTEP_CHECK(pipe(pipe_fds) == 0) << "cannot create a pipe for mpirun's output";
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  }
  pid_t pid = 0;
  const int error = posix_spawnp(&pid, "mpirun", &actions, nullptr, argv_c.data(), env_c.data());
  posix_spawn_file_actions_destroy(&actions);
  if (captured) close(pipe_fds[1]);
  LOCKSTEP_CHECK(error == 0) << "cannot start mpirun (" << std::strerror(error)
                             << "): process backends and the MPI comparison start their ranks with it; install "
                                "openmpi-bin (scripts/install-deps), or launch the ranks yourself (torchrun-style "
                                "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)";
  if (captured) {
    char buffer[4096];
    for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0;)
      captured->append(buffer, static_cast<size_t>(n));
    close(pipe_fds[0]);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<Row> mpi_reference_rows(int ranks, const std::vector<std::string>& args) {
  std::vector<std::string> child = args;
  child.insert(child.begin(), "collectives");
  child.insert(child.begin(), "bench");
  child.push_back("--mpi-reference-only");
  child.push_back("--json");
  std::string output;
  const int code = run_under_mpirun(ranks, child, &output);
  LOCKSTEP_CHECK(code == 0) << "the MPI comparison run failed (mpirun exit code " << code << ")";
  std::vector<Row> rows;
  std::stringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    Row row;
    row.what = parse_collective(j["collective"]);
    row.bytes = j["size"];
    row.reference_seconds = j["mpi_time_us"].get<double>() / 1e6;
    rows.push_back(row);
  }
  return rows;
}

// Runs body(r) on one thread per rank and rethrows the first rank's error, if any.
void run_rank_threads(int ranks, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

// ---- nccl: one thread per GPU, as nccl-tests' -g ----

// Ranks for --backend nccl in one process: -g, else every visible GPU.
int nccl_ranks(const Options& o) {
  const int gpus = cuda::device_count();
  LOCKSTEP_CHECK(gpus > 0) << "--backend nccl needs GPUs, and this process sees none: " << cuda::unavailable_reason();
  LOCKSTEP_CHECK(cuda::devices_per_gpu() == 1)
      << "--backend nccl runs one rank per GPU (NCCL allows no more), but LOCKSTEP_CUDA_DEVICES_PER_GPU="
      << cuda::devices_per_gpu() << " splits each GPU into logical devices: unset it";
  LOCKSTEP_CHECK(o.ranks <= gpus) << "-g " << o.ranks << " asks for more ranks than the " << gpus
                                  << " GPUs this process sees (one rank per GPU)";
  return o.ranks > 0 ? static_cast<int>(o.ranks) : gpus;
}

// Rank r on cuda:r, reductions in the tree order; with --compare nccl the same sizes again
// on a second communicator with NCCL's own reductions.
std::vector<Row> nccl_rows(const Options& o, int ranks) {
#if LOCKSTEP_HAVE_NCCL
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<Row> rows;
  run_rank_threads(ranks, [&](int r) {
    const Device device(DeviceType::cuda, r);
    double no_update_bw = 0;
    auto tree = comm::NcclCommunicator::create(store, "bench/tree", r, ranks, r, comm::default_timeout(), true);
    std::vector<Row> mine = measure(tree.get(), o, ranks, false, &no_update_bw, device);
    if (o.compare == "nccl") {
      auto own = comm::NcclCommunicator::create(store, "bench/nccl", r, ranks, r, comm::default_timeout(), false);
      const std::vector<Row> reference = measure(own.get(), o, ranks, false, &no_update_bw, device);
      for (size_t i = 0; i < mine.size(); ++i) {
        mine[i].reference_seconds = reference[i].ours.seconds;
        mine[i].reference_wrong = reference[i].ours.wrong;
      }
    }
    if (r == 0) rows = std::move(mine);
  });
  return rows;
#else
  (void)o;
  (void)ranks;
  LOCKSTEP_FAIL() << "this build has no nccl backend (nvcc or NCCL was not found when it was configured)";
  return {};
#endif
}

}  // namespace

int bench_collectives_main(const std::vector<std::string>& raw_args) {
  const std::vector<std::string> args = expand_short_flags(raw_args);
  Options o;
  Flags flags("lockstep bench collectives",
              "time collectives like nccl-tests, with eta and an optional MPI comparison");
  flags.add("minbytes", &o.minbytes, "smallest size (-b), e.g. 4K");
  flags.add("maxbytes", &o.maxbytes, "largest size (-e), e.g. 256M");
  flags.add("stepfactor", &o.stepfactor, "size multiplier between rows (-f)");
  flags.add("iters", &o.iters, "timed calls per size (-n)");
  flags.add("warmup_iters", &o.warmup, "untimed calls first (-w)");
  flags.add("check", &o.check, "1: verify the results and count wrong elements (-c)");
  flags.add("collective", &o.collective, "all_reduce, reduce_scatter, all_gather, broadcast, a list, or all");
  flags.add("datatype", &o.datatype, "element type (-d): f32, f64, bf16, f16, i32, i64");
  flags.add("op", &o.op, "reduction (-o): sum, avg, max, min, rounded_sum");
  flags.add("backend", &o.backend, "local (threads), shm (processes of this host), mpi, or nccl (a thread per GPU)");
  flags.add("ranks", &o.ranks, "number of ranks (-g; default: the host's cores, under nccl its GPUs)");
  flags.add("compare", &o.compare,
            "mpi: also time MPI's collectives on the same sizes; nccl (with --backend nccl): NCCL's own reductions");
  flags.add("update-bytes", &o.update_bytes, "buffer per rank for the B_update measurement");
  flags.add_switch("json", &o.json, "one JSON object per row instead of the table");
  flags.add_switch("mpi-reference-only", &o.mpi_reference_only, "(internal) time MPI alone, inside mpirun");
  if (!flags.parse(args)) return 0;
  if (o.backend != "local" && o.backend != "shm" && o.backend != "mpi" && o.backend != "nccl") {
    throw UsageError("--backend must be local, shm, mpi or nccl, got '" + o.backend + "'");
  }
  if (!o.compare.empty() && o.compare != "mpi" && o.compare != "nccl") {
    throw UsageError("--compare takes 'mpi' or 'nccl', got '" + o.compare + "'");
  }
  if (o.compare == "nccl" && (o.backend != "nccl" || inside_launched_job())) {
    throw UsageError(
        "--compare nccl sets NCCL's own reductions beside the tree order: use it with --backend nccl in one process "
        "(without a launcher)");
  }
  if (o.compare == "mpi" && o.backend == "nccl") {
    throw UsageError("--compare mpi times MPI on host buffers: compare --backend nccl with --compare nccl");
  }
  if ((o.compare == "mpi" || o.backend == "mpi") && !mpi_compiled_in()) {
    throw UsageError("this build has no MPI: install libopenmpi-dev (scripts/install-deps) and rebuild");
  }
  if (o.iters < 1) throw UsageError("-n (--iters) must be at least 1, got " + std::to_string(o.iters));
  if (o.warmup < 0) throw UsageError("-w (--warmup_iters) must be 0 or more, got " + std::to_string(o.warmup));
  // 0 stands for "the host's cores" when -g is left out.
  if (o.ranks < 0 || (flags.given("ranks") && o.ranks == 0) || o.ranks > 4096)
    throw UsageError("-g (--ranks) must be 1 to 4096, got " + std::to_string(o.ranks));
  const int ranks = static_cast<int>(o.ranks > 0 ? o.ranks : host_cores());
  // Every setting is checked here, before any rank starts.
  try {
    parse_dtype(o.datatype);
    comm::parse_reduce_op(o.op);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (o.check != 0 && o.check != 1) throw UsageError("--check must be 0 or 1, got " + std::to_string(o.check));
  collectives_of(o.collective);
  sizes_of(o, ranks);
  parse_bytes(o.update_bytes, "update-bytes", true);

  if (o.mpi_reference_only) {
    const comm::LaunchInfo job = comm::launch_info_from_env();
    double no_update_bw = 0;
    const std::vector<Row> rows = measure(nullptr, o, job.world_size, true, &no_update_bw);
    if (job.rank == 0) print_rows(rows, o, job.world_size, no_update_bw);
    return 0;
  }

  if (o.backend == "nccl" && !inside_launched_job()) {
    const int gpus = nccl_ranks(o);
    sizes_of(o, gpus);
    o.route = "reductions in the tree order";
    print_rows(nccl_rows(o, gpus), o, gpus, 0);
    return 0;
  }

  if (o.backend == "local") {
    std::vector<std::shared_ptr<comm::Communicator>> comms = comm::LocalCommunicator::create_group(ranks);
    std::vector<Row> rows;
    double update_bw = 0;
    run_rank_threads(ranks, [&](int r) {
      double bw = 0;
      std::vector<Row> mine = measure(comms[static_cast<size_t>(r)].get(), o, ranks, false, &bw);
      if (r == 0) {
        rows = std::move(mine);
        update_bw = bw;
      }
    });
    if (!o.compare.empty()) {
      const std::vector<Row> reference = mpi_reference_rows(ranks, raw_args);
      for (Row& row : rows) {
        for (const Row& ref : reference) {
          if (ref.what == row.what && ref.bytes == row.bytes) row.reference_seconds = ref.reference_seconds;
        }
      }
    }
    print_rows(rows, o, ranks, update_bw);
    return 0;
  }

  if (!inside_launched_job()) {
    std::vector<std::string> child = raw_args;
    child.insert(child.begin(), {"bench", "collectives"});
    return run_under_mpirun(ranks, child, nullptr);
  }
  std::shared_ptr<comm::Communicator> comm = comm::init_process_group(o.backend);
  if (!comm->route().empty()) o.route = "all_reduce over " + comm->route();
  // Under nccl each process drives the GPU of its local rank.
  const Device device =
      o.backend == "nccl" ? Device(DeviceType::cuda, comm::launch_info_from_env().local_rank) : Device::cpu();
  double update_bw = 0;
  const std::vector<Row> rows = measure(comm.get(), o, comm->size(), !o.compare.empty(), &update_bw, device);
  if (comm->rank() == 0) print_rows(rows, o, comm->size(), update_bw);
  return 0;
}

}  // namespace lockstep::tools
