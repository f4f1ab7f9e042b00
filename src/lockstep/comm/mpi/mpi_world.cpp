#include "lockstep/comm/mpi/mpi_world.h"

#include <bit>
#include <cstdlib>
#include <string>

#include "lockstep/comm/hierarchical_communicator.h"
#include "lockstep/comm/mpi/mpi_communicator.h"
#include "lockstep/comm/shm_communicator.h"

namespace lockstep::comm {
namespace {

bool hierarchy_disabled() {
  const char* choice = std::getenv("LOCKSTEP_MPI_HIERARCHY");
  return choice && std::string(choice) == "0";
}

// Whether every rank can take the layered route: each asks for it, and all say the same L
// ranks per host with rank = host * L + local rank. Asked of all ranks at once, so they all
// take the same route.
bool all_ranks_layered(Communicator& world, const LaunchInfo& info) {
  const int per_host = info.local_world_size;
  const bool wanted = per_host > 1 && per_host < info.world_size &&
                      std::has_single_bit(static_cast<unsigned>(per_host)) && !hierarchy_disabled();
  Tensor mine = Tensor::empty({3}, DType::i64);
  mine.data_ptr<int64_t>()[0] = per_host;
  mine.data_ptr<int64_t>()[1] = info.local_rank;
  mine.data_ptr<int64_t>()[2] = wanted ? 1 : 0;
  Tensor all = Tensor::empty({3 * static_cast<int64_t>(world.size())}, DType::i64);
  world.all_gather(mine, all);
  const int64_t* said = all.data_ptr<int64_t>();
  if (world.size() % per_host != 0) return false;
  for (int r = 0; r < world.size(); ++r) {
    if (said[3 * r] != per_host || said[3 * r + 1] != r % per_host || said[3 * r + 2] != 1) return false;
  }
  return true;
}

}  // namespace

std::shared_ptr<Communicator> create_mpi_world(const LaunchInfo& info, std::chrono::milliseconds timeout) {
  std::shared_ptr<Communicator> world = MpiCommunicator::create_world();
  LOCKSTEP_CHECK(world->size() == info.world_size && world->rank() == info.rank)
      << "MPI says rank " << world->rank() << " of " << world->size() << " but the environment (" << info.launcher
      << ") says rank " << info.rank << " of " << info.world_size << "; start the job with mpirun or srun";
  world->set_timeout(timeout);
  if (!all_ranks_layered(*world, info)) return world;
  std::shared_ptr<Communicator> cross = world->split(info.local_rank, info.rank);
  std::shared_ptr<Communicator> local =
      ShmCommunicator::create(host_store(info), "lockstep/host", info.local_rank, info.local_world_size, timeout);
  return std::make_shared<HierarchicalCommunicator>(world, local, cross);
}

}  // namespace lockstep::comm
