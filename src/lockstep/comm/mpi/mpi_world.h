// The `mpi` backend's communicator over the whole job. A job of several hosts with a power of
// two ranks on each, hosts holding consecutive ranks (mpirun's and srun's default block
// placement), gets the hierarchical all-reduce (hierarchical_communicator.h): each host's
// ranks meet in shared memory and only the hosts' partial sums cross the network. Any other
// placement, or LOCKSTEP_MPI_HIERARCHY=0, gets the flat MPI group. The bits are the same.
#pragma once

#include <chrono>
#include <memory>

#include "lockstep/comm/communicator.h"
#include "lockstep/comm/launch_env.h"

namespace lockstep::comm {

// Collective over the job. info: what the launcher said (checked against MPI's own view).
std::shared_ptr<Communicator> create_mpi_world(const LaunchInfo& info, std::chrono::milliseconds timeout);

}  // namespace lockstep::comm
