// Who am I in this job? Read from the environment the launcher set: torchrun's contract
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; `lockstep
// run` sets the same), OpenMPI's OMPI_COMM_WORLD_*, or Slurm's SLURM_PROCID/SLURM_NTASKS.
// No launcher at all is a job of one.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "lockstep/comm/store.h"

namespace lockstep::comm {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string launcher = "none";  // "torchrun", "openmpi", "slurm" or "none"
  std::string master_addr;        // empty when the launcher gave none
  int master_port = 0;
  std::string job_id;  // identifies this job among others on the host (for file rendezvous)
};

// Throws Error naming the variable when one is malformed or inconsistent
// (e.g. RANK=4 with WORLD_SIZE=4).
LaunchInfo launch_info_from_env();

// The store the ranks of this job meet at: a TcpStore at MASTER_ADDR:MASTER_PORT (rank 0
// serves it) when given, else a FileStore in a directory named by the job id.
std::shared_ptr<Store> rendezvous_store(const LaunchInfo& info, std::chrono::milliseconds timeout);

// Where a job's FileStore lives: a directory under /tmp named by the job id, this user and a
// tag only the job's ranks can compute, then `suffix`.
std::string file_store_directory(const LaunchInfo& info, const std::string& suffix);

// A FileStore for the ranks of this host alone (local rank 0 removes it): how they meet to
// share memory when the job spans hosts. Needs the launcher's job id.
std::shared_ptr<Store> host_store(const LaunchInfo& info);

}  // namespace lockstep::comm
