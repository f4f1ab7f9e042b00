// Joining the job this process was launched into: who am I (launch_env.h), where do the
// ranks meet (a Store), and which backend connects them.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "lockstep/comm/communicator.h"

namespace lockstep::comm {

// backend: "shm" (processes of one host), "mpi" (launched by mpirun or srun, any number of
// hosts), "nccl" (one GPU per rank: the LOCAL_RANK-th visible GPU), or "auto": mpi when
// the job spans hosts, else shm. Collective over the job. nccl reduces in Lockstep's tree
// order unless LOCKSTEP_NCCL_DETERMINISTIC=0 lets NCCL choose (faster, not reproducible).
std::shared_ptr<Communicator> init_process_group(const std::string& backend = "auto",
                                                 std::chrono::milliseconds timeout = default_timeout());

// Whether this build has the backend ("local", "shm", "mpi", "nccl").
bool backend_available(const std::string& backend);

}  // namespace lockstep::comm
