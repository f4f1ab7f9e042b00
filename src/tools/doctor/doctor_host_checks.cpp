// The rules about the host: /dev/shm (the shm backend and NCCL's shared-memory transport
// live there), the locked-memory limit, cores and NUMA nodes, MPI for runs past one host,
// the driver's Xid reports in the kernel log, and the IOMMU and ACS settings that decide
// whether GPUs reach each other peer-to-peer.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "lockstep/comm/env_sizes.h"
#include "lockstep/core/error.h"
#include "tools/doctor/doctor_checks.h"

namespace lockstep::tools {
namespace {

// Each rank of the shm backend maps a staging segment of this size; a value the backend
// would refuse counts as the default here (the backend's own error names it at start).
uint64_t shm_staging_bytes(const DoctorEnv& env) {
  try {
    return comm::shm_staging_bytes(env.shm_staging_bytes);
  } catch (const Error&) {
    return comm::shm_staging_bytes(std::nullopt);
  }
}

bool host_has_nvidia_gpus(const DoctorInput& in) {
  return !in.gpus.devices.empty() || !in.host.driver_gpus.empty() || !in.host.device_nodes.empty();
}

// The Xid reports of one GPU with one Xid number.
struct XidGroup {
  std::string pci_bus_id;
  int xid = 0;
  int count = 0;
  std::string latest_message;
};

std::vector<XidGroup> group_xids(const std::vector<gpu::XidEvent>& events) {
  std::map<std::pair<std::string, int>, XidGroup> groups;
  for (const gpu::XidEvent& event : events) {
    XidGroup& group = groups[{event.pci_bus_id, event.xid}];
    group.pci_bus_id = event.pci_bus_id;
    group.xid = event.xid;
    ++group.count;
    group.latest_message = event.message;
  }
  std::vector<XidGroup> out;
  for (auto& [key, group] : groups) out.push_back(std::move(group));
  return out;
}

std::string xid_text(int xid) {
  const std::string text = gpu::xid_meaning(xid).text;
  return text.empty() ? "not in Lockstep's table (NVIDIA's Xid catalog: docs.nvidia.com/deploy/xid-errors)" : text;
}

// "Xid 79 on GPU 0000:07:00.0 (3 times): GPU has fallen off the bus"
std::string describe(const XidGroup& group) {
  return "Xid " + std::to_string(group.xid) + " on GPU " + group.pci_bus_id + " (" + std::to_string(group.count) +
         (group.count == 1 ? " time" : " times") + "): " + xid_text(group.xid);
}

// The first few groups in one line; the details list every one.
std::string describe_some(const std::vector<XidGroup>& groups) {
  constexpr size_t kShown = 3;
  std::vector<std::string> parts;
  for (size_t i = 0; i < groups.size() && i < kShown; ++i) parts.push_back(describe(groups[i]));
  std::string text = join(parts, "; ");
  if (groups.size() > kShown) text += "; and " + std::to_string(groups.size() - kShown) + " more (below)";
  return text;
}

std::string bus_ids_for_command(const std::vector<XidGroup>& groups) {
  for (const XidGroup& group : groups) {
    if (group.pci_bus_id != groups.front().pci_bus_id) return "<bus id>";
  }
  return groups.front().pci_bus_id;
}

// How the IOMMU maps the GPUs' DMA addresses.
enum class IommuMode { kUnknown, kOff, kPassthrough, kTranslated };

// The values of a command-line word "key=a,b" ("intel_iommu=on,sm_on").
std::vector<std::string> cmdline_values(const std::vector<std::string>& words, const std::string& key) {
  std::vector<std::string> values;
  for (const std::string& word : words) {
    if (word.rfind(key + "=", 0) != 0) continue;
    std::string rest = word.substr(key.size() + 1);
    for (size_t comma; (comma = rest.find(',')) != std::string::npos; rest.erase(0, comma + 1)) {
      values.push_back(rest.substr(0, comma));
    }
    values.push_back(rest);
  }
  return values;
}

bool has_value(const std::vector<std::string>& values, const std::string& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

IommuMode iommu_mode(const HostFacts& host) {
  // The groups' domain types are what the kernel does, whatever the command line asked for.
  const auto& types = host.iommu_domain_types;
  if (std::any_of(types.begin(), types.end(), [](const std::string& t) { return t.rfind("DMA", 0) == 0; })) {
    return IommuMode::kTranslated;
  }
  if (has_value(types, "identity")) return IommuMode::kPassthrough;
  const std::vector<std::string>& words = host.iommu_cmdline;
  const bool passthrough =
      has_value(cmdline_values(words, "iommu"), "pt") || has_value(cmdline_values(words, "iommu.passthrough"), "1");
  if (host.iommu_present) return passthrough ? IommuMode::kPassthrough : IommuMode::kTranslated;
  if (!host.kernel_cmdline_read) return IommuMode::kUnknown;
  return IommuMode::kOff;
}

std::string cmdline_words(const HostFacts& host) {
  return host.iommu_cmdline.empty() ? "no IOMMU setting on the kernel command line"
                                    : "kernel command line: " + join(host.iommu_cmdline, " ");
}

std::string acs_bits(uint16_t control) {
  std::vector<std::string> bits;
  if (control & kAcsRequestRedirect) bits.push_back("request redirect");
  if (control & kAcsCompletionRedirect) bits.push_back("completion redirect");
  if (control & kAcsEgressControl) bits.push_back("egress control");
  return join(bits, ", ");
}

std::string hex16(uint16_t value) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%04x", value);
  return text;
}

std::string first_bridges(const std::vector<AcsBridge>& bridges) {
  constexpr size_t kShown = 4;
  std::vector<std::string> bdfs;
  for (size_t i = 0; i < bridges.size() && i < kShown; ++i) bdfs.push_back(bridges[i].bdf);
  return join(bdfs, ", ") + (bridges.size() > kShown ? ", …" : "");
}

}  // namespace

Check check_xid(const DoctorInput& in) {
  Check c{"xid", Status::kPass, "", "", {}};
  const HostFacts& host = in.host;
  if (!host.kernel_log_read) {
    // Nothing read is not a clean log: never PASS on it.
    c.status = Status::kInfo;
    c.summary =
        "unknown: the kernel log is not readable here (needs root or CAP_SYSLOG; in a container the host's log)";
    return c;
  }
  if (host.xid_events.empty()) {
    c.summary = "no Xid errors in the kernel log since boot";
    return c;
  }
  std::vector<XidGroup> serious, other;
  for (XidGroup& group : group_xids(host.xid_events)) {
    (gpu::xid_meaning(group.xid).serious ? serious : other).push_back(std::move(group));
  }
  for (const auto* groups : {&serious, &other}) {
    for (const XidGroup& group : *groups) {
      c.details.push_back(describe(group) + (group.latest_message.empty() ? "" : "; latest: " + group.latest_message));
    }
  }
  if (!serious.empty()) {
    c.status = Status::kFail;
    c.summary = describe_some(serious) + " (kernel log since boot)";
    c.fix = "drain the node, then reset the GPU (nvidia-smi -r -i " + bus_ids_for_command(serious) +
            ") or reboot; if the Xid returns on the same GPU, have it replaced (RMA, with nvidia-bug-report.sh)";
    return c;
  }
  // Known, but not serious: the program's doing. An Xid the table lacks is only reported.
  const bool all_known = std::all_of(other.begin(), other.end(),
                                     [](const XidGroup& group) { return !gpu::xid_meaning(group.xid).text.empty(); });
  c.status = Status::kWarn;
  c.summary = describe_some(other) + " (kernel log since boot)" +
              (all_known ? ": usually a program's fault, not the GPU's" : "");
  c.fix =
      "check the programs that ran there (compute-sanitizer finds bad memory accesses); if the Xids go on under other "
      "programs, reset the GPU";
  return c;
}

// NCCL's reports of what these settings do: NCCL issues 606, 631 and 2079 and nccl-tests
// issue 117 (all-reduce hangs, or peer-to-peer falls back to copies through the host).
Check check_iommu_acs(const DoctorInput& in) {
  Check c{"iommu-acs", Status::kPass, "", "", {}};
  const HostFacts& host = in.host;
  if (!host_has_nvidia_gpus(in)) {
    c.status = Status::kInfo;
    c.summary = "no NVIDIA GPU on this host: the IOMMU and ACS settings for GPU peer-to-peer traffic do not matter";
    return c;
  }
  std::vector<std::string> warnings, fixes, unknowns;
  const IommuMode mode = iommu_mode(host);
  if (mode == IommuMode::kTranslated) {
    warnings.push_back("the IOMMU translates DMA addresses (" + cmdline_words(host) +
                       "): GPU peer-to-peer traffic is remapped or blocked, so NCCL hangs or falls back to slow paths");
    fixes.push_back("add iommu=pt (or intel_iommu=off / amd_iommu=off) to the kernel command line and reboot");
  } else if (mode == IommuMode::kUnknown) {
    unknowns.push_back("the IOMMU mode (neither /proc/cmdline nor /sys/class/iommu is readable)");
  }
  if (!host.acs_redirecting_bridges.empty()) {
    const size_t n = host.acs_redirecting_bridges.size();
    warnings.push_back("ACS sends peer-to-peer traffic up to the root complex on " + std::to_string(n) + " PCI bridge" +
                       (n == 1 ? "" : "s") + " (" + first_bridges(host.acs_redirecting_bridges) +
                       "): GPUs below them cannot talk directly");
    fixes.push_back(
        "on bare metal, after each boot: sudo setpci -s <bdf> ECAP_ACS+0x6.w=0000 for each bridge listed (or turn "
        "ACS off in the BIOS); in a VM leave it on");
    for (const AcsBridge& bridge : host.acs_redirecting_bridges) {
      c.details.push_back("bridge " + bridge.bdf + ": ACS Control " + hex16(bridge.control) + " (" +
                          acs_bits(bridge.control) + "): sudo setpci -s " + bridge.bdf + " ECAP_ACS+0x6.w=0000");
    }
  } else if (host.pci_bridges_unreadable > 0) {
    unknowns.push_back("the ACS setting of " + std::to_string(host.pci_bridges_unreadable) + " of " +
                       std::to_string(host.pci_bridges) + " PCI bridges (their config space needs root to read)");
  }
  const std::string unknown = unknowns.empty() ? "" : "unknown: " + join(unknowns, "; ");
  if (!warnings.empty()) {
    c.status = Status::kWarn;
    c.summary = join(warnings, "; ");
    c.fix = join(fixes, "; ");
    if (!unknown.empty()) c.details.push_back(unknown);
    return c;
  }
  std::string iommu;
  if (mode == IommuMode::kOff) iommu = "the IOMMU is off";
  if (mode == IommuMode::kPassthrough) iommu = "the IOMMU passes DMA through (" + cmdline_words(host) + ")";
  if (!unknown.empty()) {
    c.status = Status::kInfo;
    c.summary = (iommu.empty() ? "" : iommu + "; ") + unknown;
    return c;
  }
  c.summary = iommu + "; no PCI bridge's ACS redirects peer-to-peer traffic (" + std::to_string(host.pci_bridges) +
              " bridge" + (host.pci_bridges == 1 ? "" : "s") + " checked)";
  return c;
}

Check check_shm(const DoctorInput& in) {
  Check c{"shm", Status::kPass, "", "", {}};
  const HostFacts& host = in.host;
  const std::string fix =
      "give /dev/shm more room: docker run --shm-size=16g (or --ipc=host); on Kubernetes mount an emptyDir with "
      "medium: Memory at /dev/shm";
  if (!host.shm_present) {
    c.status = Status::kFail;
    c.summary = "/dev/shm is missing: the shm backend and NCCL's shared-memory transport cannot start";
    c.fix = fix;
    return c;
  }
  // One rank per GPU, or per usable core on a CPU-only host.
  const uint64_t ranks = in.gpus.devices.empty() ? std::max(1, host.cores_allowed) : in.gpus.devices.size();
  const uint64_t staging = ranks * shm_staging_bytes(in.env);
  const uint64_t need = std::max(kShmFailBytes, staging);
  c.summary = "/dev/shm has " + format_bytes(host.shm_free_bytes) + " free of " + format_bytes(host.shm_total_bytes);
  c.details.push_back("the shm backend's staging for " + std::to_string(ranks) + " ranks: " + format_bytes(staging) +
                      "; large tensors (gradient buckets) and NCCL's buffers come on top");
  if (host.shm_free_bytes < need) {
    c.status = Status::kFail;
    c.summary += ": below the " + format_bytes(need) +
                 " a run needs (a container's 64 MiB default makes shared-memory collectives fail with 'No space "
                 "left on device' or a bus error)";
    c.fix = fix;
  } else if (host.shm_free_bytes < kShmWarnBytes) {
    c.status = Status::kWarn;
    c.summary +=
        ": enough to start, but large models' gradient buffers may not fit (below " + format_bytes(kShmWarnBytes) + ")";
    c.fix = fix;
  }
  return c;
}

Check check_memlock(const DoctorInput& in) {
  Check c{"memlock", Status::kPass, "", "", {}};
  if (!in.host.memlock_bytes) {
    c.summary = "locked-memory limit (ulimit -l) is unlimited";
    return c;
  }
  c.summary = "locked-memory limit (ulimit -l) is " + format_bytes(*in.host.memlock_bytes);
  if (*in.host.memlock_bytes < kMemlockWarnBytes && in.host.infiniband_devices.empty()) {
    // Only RDMA registers (locks) buffers against this limit; without an RDMA device the
    // small default harms nothing.
    c.status = Status::kInfo;
    c.summary += ": small, but only RDMA (InfiniBand) needs more and this host has no RDMA device";
  } else if (*in.host.memlock_bytes < kMemlockWarnBytes) {
    c.status = Status::kWarn;
    c.summary += ": too small for NCCL or MPI to register buffers with the RDMA devices (" +
                 in.host.infiniband_devices[0] + (in.host.infiniband_devices.size() > 1 ? ", …" : "") + ")";
    c.fix = "ulimit -l unlimited (for services: LimitMEMLOCK=infinity; docker: --ulimit memlock=-1)";
  }
  return c;
}

Check check_cores(const DoctorInput& in) {
  Check c{"cores", Status::kInfo, "", "", {}};
  const HostFacts& host = in.host;
  c.summary = std::to_string(host.cores_allowed) + " of " + std::to_string(host.cores_online) +
              " online cores usable by this process, " + std::to_string(host.numa_nodes.size()) + " NUMA node" +
              (host.numa_nodes.size() == 1 ? "" : "s");
  for (const NumaNode& node : host.numa_nodes) {
    c.details.push_back("NUMA node " + std::to_string(node.id) + ": CPUs " + node.cpulist + " (" +
                        std::to_string(node.cpus) + ")");
  }
  const size_t gpus = in.gpus.devices.size();
  if (gpus > 0 && static_cast<size_t>(host.cores_allowed) < 2 * gpus) {
    // One process per GPU needs a core for itself and at least one for data loading.
    c.status = Status::kWarn;
    c.summary += ": fewer than two per GPU (" + std::to_string(gpus) + " GPUs)";
    c.fix = "give the job more cores (taskset, the container's --cpus, Slurm's --cpus-per-task)";
  }
  return c;
}

Check check_mpi(const DoctorInput& in) {
  Check c{"mpi", Status::kPass, "", "", {}};
  const bool mpirun = !in.host.mpirun_path.empty();
  if (mpirun && in.build.mpi) {
    c.summary = "mpirun is " + in.host.mpirun_path + " and this lockstep has the mpi backend: runs can span hosts";
  } else if (mpirun) {
    c.status = Status::kWarn;
    c.summary = "mpirun is " + in.host.mpirun_path +
                ", but this lockstep was built without the mpi backend (CPU runs cannot span hosts)";
    c.fix = "install OpenMPI's development files (libopenmpi-dev) and rebuild lockstep";
  } else if (in.build.mpi) {
    c.status = Status::kInfo;
    c.summary = "this lockstep has the mpi backend but mpirun is not on PATH: runs stay on this host";
  } else {
    c.status = Status::kInfo;
    c.summary = "no MPI (no mpirun on PATH, no mpi backend): runs stay on this host, which needs none";
  }
  return c;
}

}  // namespace lockstep::tools
