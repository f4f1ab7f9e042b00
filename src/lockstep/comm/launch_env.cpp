#include "lockstep/comm/launch_env.h"

#include <unistd.h>

#include <cctype>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <optional>
#include <vector>

#include "lockstep/comm/file_store.h"
#include "lockstep/comm/job_secret.h"
#include "lockstep/comm/tcp_store.h"
#include "lockstep/core/error.h"

namespace lockstep::comm {

namespace {

// Unset and empty read the same: launchers and shells blank variables as often as they
// unset them.
std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int parse_int(const char* name, const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  LOCKSTEP_CHECK(ec != std::errc::invalid_argument && ptr == end) << name << "='" << text << "' is not an integer";
  LOCKSTEP_CHECK(ec == std::errc() && value >= INT_MIN && value <= INT_MAX)
      << name << "=" << text << " is out of range";
  return static_cast<int>(value);
}

std::optional<int> int_env(const char* name) {
  if (std::optional<std::string> text = env(name)) return parse_int(name, *text);
  return std::nullopt;
}

// The variables one launcher sets. local_size may be null (Slurm's is special).
struct LauncherVars {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

constexpr LauncherVars kTorchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
constexpr LauncherVars kOpenMpi{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr LauncherVars kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr};

// Whether the launcher's rank and size are both set. torchrun's and OpenMPI's always come as
// a pair, so half of one is a broken environment; Slurm sets SLURM_* in many contexts (an
// salloc shell) where it launched no tasks, so half of its pair just means "not srun".
bool detected(const LauncherVars& vars, bool strict) {
  const bool has_rank = env(vars.rank).has_value();
  const bool has_size = env(vars.size).has_value();
  if (strict && has_rank != has_size) {
    LOCKSTEP_FAIL() << (has_rank ? vars.rank : vars.size) << " is set but " << (has_rank ? vars.size : vars.rank)
                    << " is not; a " << vars.launcher << " launch sets both: set the other, or unset this one";
  }
  return has_rank && has_size;
}

// SLURM_TASKS_PER_NODE lists the tasks of each node, runs compressed: "2(x3),1" is 2, 2, 2, 1.
int slurm_tasks_on_node(const std::string& text, int node) {
  const char* kName = "SLURM_TASKS_PER_NODE";
  std::vector<int> counts;
  size_t at = 0;
  while (at < text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(at, comma - at);
    const size_t paren = item.find('(');
    int repeat = 1;
    if (paren != std::string::npos) {
      LOCKSTEP_CHECK(item.size() > paren + 3 && item.compare(paren, 2, "(x") == 0 && item.back() == ')')
          << kName << "='" << text << "' is not a Slurm task list like '2(x3),1'";
      repeat = parse_int(kName, item.substr(paren + 2, item.size() - paren - 3));
    }
    const int count = parse_int(kName, item.substr(0, paren));
    LOCKSTEP_CHECK(count >= 1 && repeat >= 1 && repeat <= 1'000'000)
        << kName << "='" << text << "' is not a Slurm task list like '2(x3),1'";
    counts.insert(counts.end(), repeat, count);
    at = comma + 1;
  }
  LOCKSTEP_CHECK(!counts.empty()) << kName << " is empty";
  LOCKSTEP_CHECK(node >= 0 && node < static_cast<int>(counts.size()))
      << "SLURM_NODEID=" << node << " is outside " << kName << "='" << text << "' (" << counts.size() << " nodes)";
  return counts[node];
}

void read_ranks(const LauncherVars& vars, LaunchInfo& info) {
  info.launcher = vars.launcher;
  info.rank = *int_env(vars.rank);
  info.world_size = *int_env(vars.size);
  LOCKSTEP_CHECK(info.world_size >= 1) << vars.size << "=" << info.world_size << " must be at least 1";
  LOCKSTEP_CHECK(info.rank >= 0 && info.rank < info.world_size)
      << vars.rank << "=" << info.rank << " is outside 0.." << info.world_size - 1 << " (" << vars.size << "="
      << info.world_size << ")";
  // Missing local variables: as if every rank ran on this host.
  info.local_rank = int_env(vars.local_rank).value_or(info.rank);
  std::optional<int> local_size;
  const char* local_size_name = vars.local_size;
  if (local_size_name != nullptr) {
    local_size = int_env(local_size_name);
  } else if ((local_size = int_env("SLURM_NTASKS_PER_NODE"))) {
    local_size_name = "SLURM_NTASKS_PER_NODE";
  } else if (std::optional<std::string> list = env("SLURM_TASKS_PER_NODE")) {
    local_size_name = "SLURM_TASKS_PER_NODE";
    local_size = slurm_tasks_on_node(*list, int_env("SLURM_NODEID").value_or(0));
  }
  if (local_size_name == nullptr) local_size_name = "the local world size";
  info.local_world_size = local_size.value_or(info.world_size);
  LOCKSTEP_CHECK(info.local_world_size >= 1 && info.local_world_size <= info.world_size)
      << local_size_name << "=" << info.local_world_size << " must be in 1.." << info.world_size << " (" << vars.size
      << ")";
  LOCKSTEP_CHECK(info.local_rank >= 0 && info.local_rank < info.local_world_size)
      << vars.local_rank << "=" << info.local_rank << " is outside 0.." << info.local_world_size - 1 << " ("
      << local_size_name << "=" << info.local_world_size << ")";
}

std::string job_id_of(const std::string& launcher) {
  std::optional<std::string> id;
  if (launcher == "torchrun") {
    id = env("TORCHELASTIC_RUN_ID");
  } else if (launcher == "openmpi") {
    id = env("OMPI_MCA_ess_base_jobid");
    if (!id) id = env("PMIX_NAMESPACE");
  } else if (launcher == "slurm") {
    if ((id = env("SLURM_JOB_ID"))) {
      if (std::optional<std::string> step = env("SLURM_STEP_ID")) *id += "." + *step;
    }
  }
  // The ranks of one launch on one host share their parent (mpirun's daemon, slurmstepd,
  // the torchrun agent), and no other launch running now shares it.
  return id ? *id : "ppid-" + std::to_string(::getppid());
}

// Job ids become part of a path: keep letters, digits, '.', '-', '_'.
std::string sanitized(const std::string& id) {
  std::string out = id;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  }
  // (Prepending by assignment: GCC 12 at -O3 misreads insert(0, …) as an overlapping copy.)
  if (out.empty() || out[0] == '.') out = "_" + out;
  return out;
}

}  // namespace

LaunchInfo launch_info_from_env() {
  LaunchInfo info;
  if (detected(kTorchrun, true)) {
    read_ranks(kTorchrun, info);
  } else if (detected(kOpenMpi, true)) {
    read_ranks(kOpenMpi, info);
  } else if (detected(kSlurm, false)) {
    read_ranks(kSlurm, info);
  }
  if (std::optional<std::string> address = env("MASTER_ADDR")) {
    LOCKSTEP_CHECK(env("MASTER_PORT").has_value())
        << "MASTER_ADDR=" << *address << " is set but MASTER_PORT is not; set MASTER_PORT to a free TCP port "
        << "(e.g. 29500), the same on every rank";
    info.master_addr = *address;
  }
  if (std::optional<int> port = int_env("MASTER_PORT")) {
    LOCKSTEP_CHECK(*port >= 1 && *port <= 65535) << "MASTER_PORT=" << *port << " is not a TCP port (1..65535)";
    info.master_port = *port;
  }
  info.job_id = job_id_of(info.launcher);
  return info;
}

std::shared_ptr<Store> rendezvous_store(const LaunchInfo& info, std::chrono::milliseconds timeout) {
  if (info.world_size == 1) return std::make_shared<MemoryStore>();
  if (!info.master_addr.empty()) {
    LOCKSTEP_CHECK(info.master_port >= 1 && info.master_port <= 65535)
        << "MASTER_ADDR=" << info.master_addr << " needs a MASTER_PORT in 1..65535, got " << info.master_port;
    return TcpStore::create(info.master_addr, info.master_port, info.rank == 0, timeout, job_secret(info));
  }
  LOCKSTEP_CHECK(info.local_world_size == info.world_size)
      << "the " << info.world_size << " ranks of this job run on several hosts (" << info.local_world_size
      << " on this one) and no MASTER_ADDR is set, so they cannot meet: set MASTER_ADDR to rank 0's host and "
         "MASTER_PORT to a free port on every rank";
  LOCKSTEP_CHECK(!info.job_id.empty())
      << "the ranks of this job cannot meet: the launcher (" << info.launcher
      << ") gave neither MASTER_ADDR nor a job id; set MASTER_ADDR to rank 0's host and MASTER_PORT to a free "
         "port on every rank";
  // Rank 0 removes the directory when its store goes, as its TcpStore would stop serving.
  return std::make_shared<FileStore>(file_store_directory(info, ""), info.rank == 0);
}

std::string file_store_directory(const LaunchInfo& info, const std::string& suffix) {
  // A tag only the job's ranks can compute: another user cannot guess the name and take the
  // directory first.
  const std::string tag_hex = to_hex(hmac_sha256(job_secret(info), "file store").substr(0, 8));
  return "/tmp/lockstep-rendezvous-" + sanitized(info.job_id) + "-" + std::to_string(::getuid()) + "-" + tag_hex +
         suffix;
}

std::shared_ptr<Store> host_store(const LaunchInfo& info) {
  LOCKSTEP_CHECK(!info.job_id.empty()) << "the ranks of this host cannot meet: the launcher (" << info.launcher
                                       << ") gave no job id";
  const int first_rank = info.rank - info.local_rank;  // names this host's directory among the job's
  return std::make_shared<FileStore>(file_store_directory(info, "-host" + std::to_string(first_rank)),
                                     info.local_rank == 0);
}

}  // namespace lockstep::comm
