// What `lockstep bench collectives` measures on every rank: one collective at one size
// (time, bandwidths, wrong elements), the in-place update bandwidth of the same ranks
// (the memory-bandwidth bound the one-host all-reduce is judged against), and MPI's own
// collectives on the same sizes for comparison.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/comm/communicator.h"

namespace lockstep::tools {

enum class Collective { all_reduce, reduce_scatter, all_gather, broadcast };
const char* collective_label(Collective c);
Collective parse_collective(const std::string& name);

struct TimingSettings {
  int64_t iters = 20;
  int64_t warmup = 5;
  bool check = true;
  DType dtype = DType::f32;
  comm::ReduceOp op = comm::ReduceOp::sum;
};

struct Timing {
  double seconds = 0;  // per call, on rank 0
  int64_t wrong = 0;   // elements off the exact answer, over all ranks (-1: not checked)
};

// Collective over comm, on buffers on `device` (this rank's GPU under nccl). bytes:
// nccl-tests' "size" (all_reduce and broadcast: the buffer; reduce_scatter: the input;
// all_gather: the output). The time is the host's from the first call to the last one's
// completion: every backend's call returns when its result is complete on this rank.
Timing time_collective(comm::Communicator& comm, Collective what, int64_t bytes, const TimingSettings& settings,
                       Device device = Device::cpu());

// Bytes per second that all of comm's ranks together update in place (x[i] += 1 over a
// private buffer of `bytes` per rank, all at once), timed like the collectives. Collective.
double update_bandwidth(comm::Communicator& comm, int64_t bytes, const TimingSettings& settings);

// nccl-tests' bus-bandwidth factor: busbw = algbw * factor.
double bus_factor(Collective what, int ranks);

// MPI's collective (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast) on
// MPI_COMM_WORLD, seconds per call on rank 0. Only inside an MPI job of this build.
double time_mpi_collective(Collective what, int64_t bytes, const TimingSettings& settings);
bool mpi_compiled_in();

}  // namespace lockstep::tools
