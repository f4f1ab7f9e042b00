// ZeRO: the optimizer state is cut into equal shards, one per rank. The model's parameters
// become views of one flat buffer (FlatGradients' order); every unit of it is padded to a
// multiple of the rank count, and rank r owns the r-th equal part of each unit (FSDP's flat
// parameters, one per unit). Each rank's optimizer runs over its parts, one tensor per unit.
// A step updates them in place from the reduced gradients of the same ranges and
// all-gathers every rank's parts back into the buffer, unit by unit. Where the ranks share
// memory (threads, or processes of one host under `shm`: Communicator::empty_common) the
// buffer is one copy for them all: each rank updates its parts in place and a barrier takes
// the all-gather's place. The optimizers are elementwise, so each element gets the very
// update the unsharded optimizer gives it: the same bits with 1/N of the state per rank.
//
// ZeRO-3 keeps no full copy at all: the parameters live in ShardedWeights, a step updates
// this rank's parts alone, and each unit is gathered when it is next used.
//
// A rank's shard buffer (its gradients under ZeRO-2) holds its part of each unit in unit
// order: unit u's part starts at u.begin / N.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/nn/named_tensors.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/flat_gradients.h"
#include "lockstep/parallel/sharded_weights.h"
#include "lockstep/parallel/step.h"

namespace lockstep::parallel {

using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> params)>;

// Called with this rank's parts of the reduced gradients (one tensor per unit, which it may
// change in place) before they are stepped: whether to step them. Collective where it must be:
// every rank must give the same answer, as an f16 step's skip (sharded_loss_scaling.h).
using UpdateGate = std::function<bool(const std::vector<Tensor>& grads)>;

class ShardedOptimizer {
 public:
  // layout: the parameters, built with shards = comm.size(). Every rank's parameters must
  // hold the same values. They are moved into the flat buffer (Tensor::set_data): handles to
  // them stay valid. share_weights: one buffer for every rank where the ranks share memory;
  // false, each its own. shard_weights (ZeRO-3): each rank keeps only its parts of them
  // (sharded_weights()), and share_weights does not apply. Collective.
  ShardedOptimizer(const FlatGradients& layout, comm::Communicator& comm, const OptimizerFactory& make_optimizer,
                   bool share_weights = true, bool shard_weights = false);

  // Elements of this rank's shard buffer: padded_numel() / size.
  int64_t shard_size() const { return layout_.padded_numel() / comm_.size(); }
  // Where this rank's part of unit u lies in the flat buffer, and in its shard buffer.
  int64_t part_begin(size_t unit) const;
  static int64_t shard_offset(const FlatUnit& unit, int ranks) { return unit.begin / ranks; }
  // One step from this rank's unreduced gradients (a flat buffer in the layout's order):
  // reduce-scatter them unit by unit, update this rank's parts, all-gather every part into
  // the parameters, or wait for every rank's update where the buffer is common (collective).
  // Adds the time spent to times.communicate and times.optimizer. grad_shard: where this
  // rank's part of the reduced gradients goes (shard_size() elements), made here when
  // undefined; a caller that must not run out of memory past some point makes it before.
  // gate: asked before the update; on false nothing is stepped or gathered (every rank must
  // agree), the weights and state unchanged.
  void step(const Tensor& gradients, DeviceTimes& times, const Tensor& grad_shard = Tensor(),
            const UpdateGate& gate = nullptr);
  // The same from gradients every rank has reduced already (an all-reduce, as distributed
  // data parallelism runs bucket by bucket during backward): updates this rank's parts from
  // its ranges of them, then as step().
  void step_reduced(const Tensor& sums, DeviceTimes& times, const UpdateGate& gate = nullptr);
  // The same from this rank's shard buffer of reduced gradients (ZeRO-2 reduce-scatters them
  // during backward).
  void step_shard(const Tensor& grad_shard, DeviceTimes& times, const UpdateGate& gate = nullptr);
  void set_lr(double lr) { optimizer_->set_lr(lr); }
  double lr() const { return optimizer_->lr(); }
  // Bytes of optimizer state this rank holds.
  int64_t state_bytes() const { return optimizer_->state_bytes(); }
  // The optimizer over this rank's parts, one parameter per unit (its slots, its "step").
  optim::Optimizer& optimizer() { return *optimizer_; }
  const optim::Optimizer& optimizer() const { return *optimizer_; }
  // Whether every rank's parameters are one copy in memory they share.
  bool common_weights() const { return common_; }
  // ZeRO-3's parameters; null unless shard_weights.
  ShardedWeights* sharded_weights() { return sharded_weights_.get(); }

  // The state an unsharded optimizer over the parameters would have ("step",
  // "state.<param>.<slot>"), gathered from every rank: collective. Checkpoints hold this,
  // so they load on any number of ranks, sharded or not.
  // root >= 0: only rank `root` assembles it (the others send their parts and get an empty
  // list), so a checkpoint costs the other ranks no full copy.
  NamedTensors full_state_dict(int root = -1);
  // Takes this rank's parts of such a state (not collective).
  void load_full_state_dict(const NamedTensors& state);

 private:
  // Updates the parts from their gradients (one per unit; released before the weights are
  // gathered), then gathers the parts or waits for them.
  void update(std::vector<Tensor> grads, DeviceTimes& times, const UpdateGate& gate);
  // Slot s of the optimizer's state as a full flat buffer, on every rank (root < 0) or on
  // root alone (the others send and get an undefined tensor).
  Tensor gather_slot(size_t slot, int root);

  const FlatGradients& layout_;
  comm::Communicator& comm_;
  Tensor weights_;                                   // every parameter's elements, padded (not under ZeRO-3)
  std::unique_ptr<ShardedWeights> sharded_weights_;  // ZeRO-3
  bool common_ = false;                              // weights_ is the same memory on every rank
  std::vector<Tensor> parts_;                        // this rank's part of each unit, optimizer_'s parameters
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace lockstep::parallel
