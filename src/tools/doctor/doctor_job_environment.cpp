// `lockstep doctor -- CMD`: the environment variables that change how the command's
// framework uses the GPUs, each with what it does, and a warning for the settings that
// slow a job down or hide its failures. A misspelled NCCL variable does nothing, silently:
// names this table does not know are listed as such.
#include <algorithm>
#include <cstdlib>

#include "tools/doctor/doctor_checks.h"

namespace lockstep::tools {
namespace {

struct KnownVariable {
  const char* name;
  const char* what;
  // The value that deserves a warning ("" none) and why.
  const char* warn_value = "";
  const char* warning = "";
};

const std::vector<KnownVariable>& known_variables() {
  static const std::vector<KnownVariable> table = {
      {"CUDA_VISIBLE_DEVICES", "the GPUs the program sees, in this order, numbered from 0 (see visible-devices)", "",
       ""},
      {"CUDA_DEVICE_ORDER", "PCI_BUS_ID numbers the GPUs as nvidia-smi does; the default, FASTEST_FIRST, may not"},
      {"CUDA_LAUNCH_BLOCKING", "1 makes every kernel launch wait for the GPU, to find which kernel failed", "1",
       "every launch waits: training runs many times slower; for debugging only"},
      {"CUDA_MODULE_LOADING",
       "LAZY (the default since CUDA 12.2) loads kernels on first use; EAGER loads all at start"},
      {"PYTORCH_CUDA_ALLOC_CONF",
       "PyTorch's caching allocator: expandable_segments:True cuts fragmentation, max_split_size_mb limits splitting"},
      {"PYTORCH_ALLOC_CONF", "PyTorch's caching allocator (the newer name of PYTORCH_CUDA_ALLOC_CONF)"},
      {"OMP_NUM_THREADS",
       "OpenMP threads per process for CPU work; torchrun sets 1 per worker when it starts several, lockstep run "
       "divides the cores among the workers"},
      {"NCCL_DEBUG", "NCCL's log: WARN prints errors, INFO also the set-up (rings, trees, transports)", "TRACE",
       "TRACE logs every call: slow and large"},
      {"NCCL_DEBUG_SUBSYS", "which parts of NCCL log (INIT, COLL, P2P, NET, …)"},
      {"NCCL_DEBUG_FILE", "where NCCL's log goes (%h host, %p pid) instead of stderr"},
      {"NCCL_SOCKET_IFNAME",
       "the network interfaces NCCL uses for its bootstrap and TCP traffic (^lo,docker0 excludes)"},
      {"NCCL_IB_DISABLE", "1 turns off InfiniBand and RoCE: traffic between hosts goes over TCP sockets", "1",
       "no RDMA between hosts: all-reduce across hosts runs at TCP speed"},
      {"NCCL_IB_HCA", "which RDMA adapters (and ports) NCCL uses"},
      {"NCCL_NET", "forces NCCL's network transport (IB, Socket, or a plugin's)"},
      {"NCCL_NET_GDR_LEVEL", "how close a NIC and a GPU must be for GPUDirect RDMA"},
      {"NCCL_P2P_DISABLE", "1 turns off direct GPU-to-GPU copies over NVLink and PCIe", "1",
       "GPUs of this host exchange data through host memory: all-reduce slows down several times"},
      {"NCCL_P2P_LEVEL", "how close two GPUs must be for direct copies (LOC, NVL, PIX, PXB, PHB, SYS)"},
      {"NCCL_SHM_DISABLE", "1 turns off the shared-memory transport between processes of this host", "1",
       "processes of this host exchange data over the network stack instead"},
      {"NCCL_ALGO",
       "forces the collective algorithms (Ring, Tree, NVLS, CollNet); NCCL's own choice is usually faster"},
      {"NCCL_PROTO", "forces the protocols (LL, LL128, Simple); NCCL's own choice is usually faster"},
      {"NCCL_BUFFSIZE", "bytes of buffer per channel (4 MiB by default)"},
      {"NCCL_MIN_NCHANNELS", "the fewest channels (parallel rings or trees, one SM each) NCCL uses"},
      {"NCCL_MAX_NCHANNELS", "the most channels (parallel rings or trees, one SM each) NCCL uses"},
      {"NCCL_NTHREADS", "CUDA threads per channel"},
      {"NCCL_CROSS_NIC", "whether a ring may leave a host on one NIC and enter the next on another"},
      {"NCCL_LAUNCH_MODE", "PARALLEL or GROUP launch of the kernels of several GPUs in one process"},
      {"NCCL_CUMEM_ENABLE", "cuMem* allocations for NCCL's buffers (on by default since NCCL 2.19)"},
      {"NCCL_NVLS_ENABLE", "NVLink SHARP reductions on NVSwitch systems (HGX H100, H200)"},
      {"NCCL_ASYNC_ERROR_HANDLING",
       "the name PyTorch before 2.2 read for TORCH_NCCL_ASYNC_ERROR_HANDLING; newer PyTorch warns and reads it too"},
      {"NCCL_BLOCKING_WAIT", "the name PyTorch before 2.2 read for TORCH_NCCL_BLOCKING_WAIT"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING",
       "what PyTorch does when a collective fails or times out: 1 or 3 end the process so the launcher sees it", "0",
       "a failed or timed-out collective is not acted on: the job hangs instead of ending"},
      {"TORCH_NCCL_BLOCKING_WAIT", "1 makes the host wait for every collective, so a timeout raises in Python", "1",
       "every collective blocks the host: slower; for debugging"},
      {"TORCH_NCCL_TRACE_BUFFER_SIZE", "entries of PyTorch's flight recorder, dumped when a collective times out"},
      {"TORCH_NCCL_DUMP_ON_TIMEOUT", "1 writes the flight recorder's entries when a collective times out"},
      {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "seconds the watchdog may stall before PyTorch ends the process"},
      {"TORCH_NCCL_ENABLE_MONITORING", "whether PyTorch watches its own NCCL watchdog for stalls"},
      {"TORCH_NCCL_DESYNC_DEBUG", "1 reports which rank fell behind when a collective times out"},
      {"TORCH_NCCL_AVOID_RECORD_STREAMS", "frees collective buffers by stream order instead of recordStream"},
      {"TORCH_NCCL_HIGH_PRIORITY", "1 runs NCCL's kernels on high-priority streams"},
      {"TORCH_NCCL_USE_COMM_NONBLOCKING", "1 creates NCCL communicators in non-blocking mode"},
      {"TORCH_DISTRIBUTED_DEBUG", "DETAIL checks every collective's shapes across ranks: finds desyncs", "DETAIL",
       "every collective is checked across ranks: slower; for debugging"},
      {"TF_FORCE_GPU_ALLOW_GROWTH", "true makes TensorFlow take GPU memory as it needs it, not all at start"},
      {"XLA_PYTHON_CLIENT_PREALLOCATE", "false stops JAX from taking 75% of each GPU's memory at start"},
      {"XLA_PYTHON_CLIENT_MEM_FRACTION", "the share of each GPU's memory JAX takes at start"},
      {"LD_PRELOAD", "libraries loaded before all others: a libnccl or libcudnn here replaces the framework's own"},
      {"LD_LIBRARY_PATH",
       "folders searched first for libraries: a libnccl or libcudnn here can replace the framework's"},
  };
  return table;
}

// Edits (insert, delete, replace) between two names.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// A known name one or two edits away: the one a typo meant.
std::string nearest_known(const std::string& name) {
  for (const KnownVariable& known : known_variables()) {
    if (edit_distance(name, known.name) <= 2) return known.name;
  }
  return "";
}

bool gpu_related(const std::string& name) { return name.rfind("NCCL_", 0) == 0 || name.rfind("TORCH_NCCL_", 0) == 0; }

}  // namespace

Check check_job_environment(const DoctorInput& in) {
  Check c{"environment", Status::kPass, "", "", {}};
  const auto& vars = in.job->variables;
  int shown = 0;
  std::vector<std::string> slowing, misspelled, fixes;
  bool too_many_threads = false;
  for (const KnownVariable& known : known_variables()) {
    const auto it = vars.find(known.name);
    if (it == vars.end()) continue;
    ++shown;
    c.details.push_back(std::string(known.name) + "=" + it->second + ": " + known.what);
    std::string warning;
    if (*known.warn_value != '\0' && it->second == known.warn_value) warning = known.warning;
    if (std::string(known.name) == "NCCL_IB_DISABLE" && in.host.infiniband_devices.empty()) warning.clear();
    if (!warning.empty()) slowing.push_back(known.name);
    if (std::string(known.name) == "OMP_NUM_THREADS" && in.host.cores_allowed > 0 &&
        std::atoi(it->second.c_str()) > in.host.cores_allowed) {
      too_many_threads = true;
      warning = "more threads than the " + std::to_string(in.host.cores_allowed) +
                " usable cores: each process oversubscribes them";
    }
    if (!warning.empty()) c.details.back() += " — " + warning;
  }
  for (const auto& [name, value] : vars) {
    if (!gpu_related(name)) continue;
    const bool known = std::any_of(known_variables().begin(), known_variables().end(),
                                   [&](const KnownVariable& k) { return name == k.name; });
    if (known) continue;
    ++shown;
    const std::string nearest = nearest_known(name);
    c.details.push_back(name + "=" + value + ": not a variable this doctor knows" +
                        (nearest.empty() ? "" : " (did you mean " + nearest + "?)") +
                        "; NCCL and PyTorch ignore misspelled names silently");
    if (!nearest.empty()) {
      misspelled.push_back(name);
      fixes.push_back("rename " + name + " to " + nearest);
    }
  }
  if (vars.find("OMP_NUM_THREADS") == vars.end()) {
    c.details.push_back(
        "OMP_NUM_THREADS is not set: a framework started alone uses every core per process; torchrun "
        "and lockstep run set it per worker");
  }
  c.summary = shown == 0 ? "no variable that changes how the command uses GPUs is set: the frameworks' defaults apply"
                         : std::to_string(shown) + " variable" + (shown == 1 ? "" : "s") +
                               " that change how the command uses GPUs " + (shown == 1 ? "is" : "are") + " set";
  if (!slowing.empty()) {
    c.summary += "; " + join(slowing, ", ") + (slowing.size() == 1 ? " is" : " are") +
                 " set to slow the job down or hide its failures (below)";
    fixes.push_back("unset " + join(slowing, " ") + " unless you are debugging");
  }
  if (too_many_threads) {
    c.summary += "; OMP_NUM_THREADS exceeds the usable cores";
    fixes.push_back("set OMP_NUM_THREADS to the usable cores divided by the processes per host");
  }
  if (!misspelled.empty())
    c.summary += "; " + join(misspelled, ", ") + " look" + (misspelled.size() == 1 ? "s" : "") + " misspelled";
  if (!fixes.empty()) {
    c.status = Status::kWarn;
    c.fix = join(fixes, "; ");
  }
  return c;
}

}  // namespace lockstep::tools
