// ZeRO stage 1: the optimizer state is cut into equal shards, one per rank. The model's
// parameters become views of one flat buffer (FlatGradients' order, padded to equal
// shards); each rank's optimizer runs over its range of that buffer as one tensor. A step
// updates the shard in place from the reduced gradients of the same range and all-gathers
// every rank's shard back into the buffer. Where the ranks share memory (threads, or
// processes of one host under `shm`: Communicator::empty_common) the buffer is one copy for
// them all: each rank updates its shard in place and a barrier takes the all-gather's place.
// The optimizers are elementwise, so each element gets the very update the unsharded
// optimizer gives it: the same bits with 1/N of the state per rank.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/nn/named_tensors.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/flat_gradients.h"
#include "lockstep/parallel/step.h"

namespace lockstep::parallel {

using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> params)>;

class ShardedOptimizer {
 public:
  // layout: the parameters, padded to a multiple of comm.size() elements. Every rank's
  // parameters must hold the same values. They are moved into the flat buffer
  // (Tensor::set_data): handles to them stay valid. Collective.
  ShardedOptimizer(const FlatGradients& layout, comm::Communicator& comm, const OptimizerFactory& make_optimizer);

  int64_t shard_size() const { return shard_.numel(); }
  int64_t shard_begin() const { return shard_size() * comm_.rank(); }
  // One step from this rank's unreduced gradients (a flat buffer in the layout's order):
  // reduce-scatter them, update this rank's shard, all-gather every shard into the
  // parameters, or wait for every rank's update where the buffer is common (collective).
  // Adds the time spent to times.communicate and times.optimizer.
  void step(const Tensor& gradients, DeviceTimes& times);
  // The same from gradients every rank has reduced already (an all-reduce, as distributed
  // data parallelism runs bucket by bucket during backward): updates this rank's shard
  // from its range of them, then as step().
  void step_reduced(const Tensor& sums, DeviceTimes& times);
  void set_lr(double lr) { optimizer_->set_lr(lr); }
  double lr() const { return optimizer_->lr(); }
  // Bytes of optimizer state this rank holds.
  int64_t state_bytes() const { return optimizer_->state_bytes(); }
  // Whether every rank's parameters are one copy in memory they share.
  bool common_weights() const { return common_; }

  // The state an unsharded optimizer over the parameters would have ("step",
  // "state.<param>.<slot>"), gathered from every rank: collective. Checkpoints hold this,
  // so they load on any number of ranks, sharded or not.
  // root >= 0: only rank `root` assembles it (the others send their shards and get an empty
  // list), so a checkpoint costs the other ranks no full copy.
  NamedTensors full_state_dict(int root = -1);
  // Takes this rank's shard of such a state (not collective).
  void load_full_state_dict(const NamedTensors& state);

 private:
  // Updates the shard from its gradients (released before the weights are gathered), then
  // gathers the shards or waits for them.
  void update(Tensor grad_shard, DeviceTimes& times);

  const FlatGradients& layout_;
  comm::Communicator& comm_;
  Tensor weights_;       // every parameter's elements, padded
  bool common_ = false;  // weights_ is the same memory on every rank
  Tensor shard_;         // this rank's range of weights_, the one parameter of optimizer_
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace lockstep::parallel
