#include "lockstep/comm/init.h"

#include <cstdlib>

#include "lockstep/comm/launch_env.h"
#include "lockstep/comm/shm_communicator.h"
#if LOCKSTEP_HAVE_MPI
#include "lockstep/comm/mpi/mpi_world.h"
#endif
#if LOCKSTEP_HAVE_NCCL
#include "lockstep/comm/cuda/nccl_communicator.h"
#endif

namespace lockstep::comm {
namespace {

#if LOCKSTEP_HAVE_MPI
constexpr bool kHaveMpi = true;
#else
constexpr bool kHaveMpi = false;
#endif
#if LOCKSTEP_HAVE_NCCL
constexpr bool kHaveNccl = true;
#else
constexpr bool kHaveNccl = false;
#endif

}  // namespace

bool backend_available(const std::string& backend) {
  if (backend == "local" || backend == "shm") return true;
  if (backend == "mpi") return kHaveMpi;
  if (backend == "nccl") return kHaveNccl;
  return false;
}

std::shared_ptr<Communicator> init_process_group(const std::string& requested, std::chrono::milliseconds timeout) {
  LOCKSTEP_CHECK(requested == "auto" || requested == "shm" || requested == "mpi" || requested == "nccl")
      << "unknown process-group backend '" << requested << "': use auto, shm, mpi or nccl";
  const LaunchInfo info = launch_info_from_env();
  FlightRecorder::process().start(info.rank);  // a hang's report names this rank
  std::string backend = requested;
  if (backend == "nccl") {
#if LOCKSTEP_HAVE_NCCL
    const char* choice = std::getenv("LOCKSTEP_NCCL_DETERMINISTIC");
    const bool deterministic = !(choice && std::string(choice) == "0");
    return NcclCommunicator::create(rendezvous_store(info, timeout), "lockstep/world", info.rank, info.world_size,
                                    info.local_rank, timeout, deterministic);
#else
    LOCKSTEP_FAIL() << "this build has no nccl backend (nvcc or NCCL was not found when it was configured)";
#endif
  }
  if (backend == "auto") backend = info.local_world_size < info.world_size ? "mpi" : "shm";
  if (backend == "mpi") {
#if LOCKSTEP_HAVE_MPI
    return create_mpi_world(info, timeout);
#else
    LOCKSTEP_FAIL() << "this build has no MPI backend (libopenmpi-dev was not found when it was configured); "
                       "install it with scripts/install-deps and rebuild, or use --backend shm on one host";
#endif
  }
  LOCKSTEP_CHECK(info.local_world_size == info.world_size)
      << "the shm backend connects processes of one host, but this job has " << info.world_size << " ranks and "
      << info.local_world_size << " on this host; use the mpi backend";
  return ShmCommunicator::create(rendezvous_store(info, timeout), "lockstep/world", info.rank, info.world_size,
                                 timeout);
}

}  // namespace lockstep::comm
