// Ranks on several hosts, each host holding the same number of consecutive ranks: an
// all_reduce folds each host's ranks in shared memory (`local`), then reduces the hosts'
// partial sums over the network (`cross`: one rank per host, all of one local rank, each
// taking its slice of the buffer), then spreads the result over each host again. Every
// byte crosses the network once per host instead of once per rank.
//
// The bits are the flat tree's (tree_reduce.h): with a power of two ranks per host, each
// host's partial sum is a node of the tree over all ranks, and the tree over the hosts'
// nodes is the rest of it. bf16 and f16 sums and averages, which the flat tree accumulates
// in f32 and rounds once, travel between hosts in f32 for that reason; rounded_sum needs no
// such widening and crosses in its own dtype. Every other call goes to the flat group.
#pragma once

#include <memory>

#include "lockstep/comm/communicator.h"

namespace lockstep::comm {

class HierarchicalCommunicator : public Communicator {
 public:
  // flat: every rank of the job; local: this host's ranks, in rank order; cross: the ranks
  // whose local rank is this one's, in host order. Rank r of flat must be rank
  // r % local->size() of local and r / local->size() of cross, and local->size() a power
  // of two (or cross->size() 1): throws Error otherwise.
  HierarchicalCommunicator(std::shared_ptr<Communicator> flat, std::shared_ptr<Communicator> local,
                           std::shared_ptr<Communicator> cross);
  ~HierarchicalCommunicator() override;

  // The flat group's backend: the layering changes the route, never the result.
  const char* backend() const override { return flat_->backend(); }
  int hosts() const { return cross_->size(); }
  int ranks_per_host() const { return local_->size(); }
  std::string route() const override;

  // This host's shared memory, so the first fold reads tensors where they lie.
  Tensor empty_shared(const Shape& shape, DType dtype, Device device = Device::cpu()) override;

 protected:
  void abort_peers(const std::string& reason) override;
  void do_all_reduce(const Tensor& tensor, const CollectiveDesc& desc) override;
  void do_reduce_scatter(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) override;
  void do_all_gather(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) override;
  void do_broadcast(const Tensor& tensor, const CollectiveDesc& desc) override;
  void do_send(const Tensor& tensor, int peer, int tag) override;
  void do_recv(const Tensor& tensor, int peer, int tag) override;
  void do_barrier(const CollectiveDesc& desc) override;
  std::shared_ptr<Communicator> do_split(int color, int key, const CollectiveDesc& desc) override;

 private:
  // local, then cross on this rank's slice, then the slices back to every local rank;
  // average divides this rank's reduced slice by the rank count before it is spread.
  void reduce_by_host(const Tensor& flat_tensor, ReduceOp op, bool average);

  std::shared_ptr<Communicator> flat_;
  std::shared_ptr<Communicator> local_;
  std::shared_ptr<Communicator> cross_;
};

}  // namespace lockstep::comm
