// The `mpi` backend: CPU tensors between processes, on one host or many, over MPI (OpenMPI
// launched by mpirun or Slurm's srun). Reductions never use MPI's own reduction (its order is
// not ours): ranks exchange slices, fold them with tree_reduce in rank order, and gather.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>

#include "lockstep/comm/communicator.h"

namespace lockstep::comm {

class MpiCommunicator : public Communicator {
 public:
  // A communicator over all processes of the job (a private duplicate of MPI_COMM_WORLD).
  // Initializes MPI on first use unless the program already did; MPI is then finalized once,
  // at process exit. Collective over the job. Creating, destroying and creating again is fine.
  //
  // Threads: MPI is asked for MPI_THREAD_MULTIPLE, so communicators from split() can be used
  // from different threads at once. Where MPI provides only MPI_THREAD_SERIALIZED (or the
  // program initialized MPI itself with less), every MPI call of the process is serialized
  // by one mutex; two communicators used concurrently by different threads can then wait on
  // each other, so use them from one thread in that case.
  //
  // Timeouts: MPI cannot time out a blocking call, so a call still running after timeout()
  // makes a per-process watchdog print which call of which rank hung and MPI_Abort the job.
  static std::shared_ptr<MpiCommunicator> create_world();
  ~MpiCommunicator() override;

  const char* backend() const override { return "mpi"; }

  // The most bytes one MPI call moves (default 256 MiB, at most 1 GiB): larger tensors go in
  // pieces, since MPI counts are ints. It also bounds the scratch memory a reduction keeps
  // (about this much per communicator). Collectives use rank 0's value; a send tells its
  // receiver its own. Tests lower it to exercise the pieces.
  void set_max_message_bytes(size_t bytes);
  size_t max_message_bytes() const { return max_message_bytes_.load(std::memory_order_relaxed); }

 protected:
  void do_all_reduce(const Tensor& tensor, const CollectiveDesc& desc) override;
  void do_reduce_scatter(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) override;
  void do_all_gather(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) override;
  void do_broadcast(const Tensor& tensor, const CollectiveDesc& desc) override;
  void do_send(const Tensor& tensor, int peer, int tag) override;
  void do_recv(const Tensor& tensor, int peer, int tag) override;
  void do_barrier(const CollectiveDesc& desc) override;
  std::shared_ptr<Communicator> do_split(int color, int key, const CollectiveDesc& desc) override;

 private:
  struct Handle;  // the MPI_Comm, kept out of this header so users need no mpi.h
  MpiCommunicator(std::unique_ptr<Handle> handle, int rank, int size);

  std::unique_ptr<Handle> handle_;
  std::atomic<size_t> max_message_bytes_;
};

}  // namespace lockstep::comm
