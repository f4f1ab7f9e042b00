// The rules about the host: /dev/shm (the shm backend and NCCL's shared-memory transport
// live there), the locked-memory limit, cores and NUMA nodes, and MPI for runs past one host.
#include <algorithm>
#include <cstdlib>

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

}  // namespace

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
