// The `nccl` backend: CUDA tensors between GPUs, one rank per GPU, over NCCL. By default
// reductions are NCCL's own (fastest, but NCCL chooses their order); in deterministic mode
// the ranks exchange slices and fold them with tree_reduce's order on the GPU, so results
// are the same bits as every other backend's (docs: "The nccl backend").
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "lockstep/comm/communicator.h"
#include "lockstep/comm/store.h"

namespace lockstep::comm {

class NcclCommunicator : public Communicator {
 public:
  // Collective over `size` ranks that share `store` (rank 0 publishes NCCL's unique id at
  // "<prefix>/nccl_unique_id"; prefix must be fresh for each communicator). This rank uses
  // GPU cuda_device; tensors passed to it must live there. Waits up to timeout for the
  // others, then throws CommError. NCCL allows one rank per GPU per communicator.
  static std::shared_ptr<NcclCommunicator> create(std::shared_ptr<Store> store, const std::string& prefix, int rank,
                                                  int size, int cuda_device, std::chrono::milliseconds timeout,
                                                  bool deterministic);
  ~NcclCommunicator() override;

  const char* backend() const override { return "nccl"; }
  int cuda_device() const;
  bool deterministic() const;
  // This rank's GPU: host tensors (a flag, a loss, a checkpoint's pieces) go through it.
  Device memory() const override;

  // Calls wait until their result is complete on this rank. They first wait for the work
  // queued so far on the device's legacy default stream (and the blocking streams), which
  // is where the tensors are expected to have been written.

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
  struct State;  // NCCL and CUDA handles, kept out of this header so users need no nccl.h
  NcclCommunicator(int rank, int size, std::unique_ptr<State> state);
  // A communicator over state's NCCL communicator, taking its rank and size from it.
  static std::shared_ptr<NcclCommunicator> wrap(std::unique_ptr<State> state);

  // Every rank's description of the call, exchanged on the GPU; throws on every rank alike
  // when they differ or a tensor is not on its rank's GPU.
  void agree(const CollectiveDesc& desc, const Tensor* a, const Tensor* b, const std::string& what);
  void deterministic_all_reduce(const Tensor& tensor, const CollectiveDesc& desc, const std::string& what);
  void deterministic_reduce_scatter(const Tensor& input, const Tensor& output, const CollectiveDesc& desc,
                                    const std::string& what);
  // ncclCommSplit's work done through the store, for NCCL older than 2.18.
  std::shared_ptr<Communicator> split_through_store(int color, int key, const CollectiveDesc& desc);

  std::unique_ptr<State> state_;
};

}  // namespace lockstep::comm
