// Distributed data parallelism: one process (or thread) per device, each with its own
// replica and a Communicator (`shm`, `mpi`, `local`, later `nccl`) — PyTorch's
// DistributedDataParallel, with the step-is-a-tree guarantee:
// - at construction rank 0's parameters and buffers are broadcast, so every rank starts
//   from the same weights;
// - a step runs this rank's run of micro-batches; on all but the last, gradients are folded
//   locally and nothing is communicated (PyTorch's no_sync);
// - during the last micro-batch's backward, gradients are packed into buckets (parameters
//   in reverse order, the first bucket small so communication starts early); as soon as a
//   bucket is complete its part of the rank's subtree is folded and its all-reduce starts,
//   overlapping communication with the rest of backward. Buckets start in order on every
//   rank; parameters that got no gradient count as zeros;
// - then the ranks agree that every one of them finished its share (step_agreement.h: the
//   loss's all-reduce, one element longer), and only then are the running statistics
//   applied and the optimizer stepped. A rank that ran out of memory on the way still makes
//   the bucket collectives it owes, on placeholders, and joins the agreement: every rank
//   then drops the step with nothing changed, so it can be taken again with a smaller
//   micro-batch (distributed_data_parallel_recovery.cpp; not under ZeRO-3 or local SGD);
// - ZeRO (sharded_optimizer.h) shards the optimizer state: every bucket is cut into equal
//   parts, one per rank, and each rank steps its part of every bucket, then the weights are
//   all-gathered bucket by bucket. Stage 1 keeps the final micro-batch's full gradient
//   buffer and reduce-scatters it after backward. Stage 2 keeps a few buckets of it: each
//   bucket is reduce-scattered the moment backward completes it (overlapped, as the
//   all-reduce is) and freed once sent — two in flight at most, the next two made ahead —
//   so a rank holds 1/N of the reduced gradients. Stage 3 (FSDP) shards the weights as well:
//   each rank keeps its parts of them alone, and the model's unit modules are gathered just
//   before their forward and backward and released after (parameter_gathering.h). The
//   buckets are then the units' parameters; gathering copies exactly, and the tree is the
//   same, so are the bits;
// - ranks that share memory (`shm` processes, `local` threads) on CPU devices keep one copy
//   of the weights, and each steps only its parts of them after the all-reduce (ZeRO's
//   sharding, with the buckets' overlap kept and nothing to gather), so no rank repeats the
//   optimizer; with ZeRO as well, a barrier takes the all-gather's place (share_weights).
//
// The earlier micro-batches of a rank's run are folded locally into full-size partial sums
// under every stage: the rank's subtree of the step's tree must be complete before any of it
// crosses to another rank, which is what keeps the bits (DeepSpeed's stage 2 instead
// reduce-scatters every micro-batch). One micro-batch per rank is where stage 2 saves the
// most.
// The weights are the bits DataParallel gives on as many devices, and one device gives.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/comm/work.h"
#include "lockstep/nn/module.h"
#include "lockstep/optim/loss_scaler.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/optim/optimizer_read_guard.h"
#include "lockstep/parallel/flat_gradients.h"
#include "lockstep/parallel/gradient_collector.h"
#include "lockstep/parallel/gradient_tree.h"
#include "lockstep/parallel/layout.h"
#include "lockstep/parallel/parameter_gathering.h"
#include "lockstep/parallel/powersgd.h"
#include "lockstep/parallel/sharded_optimizer.h"
#include "lockstep/parallel/step.h"
#include "lockstep/parallel/step_statistics.h"

namespace lockstep::parallel {

struct DistributedDataParallelOptions {
  LossFunction loss = nullptr;               // one loss per sample of a micro-batch (loss_function.h)
  int64_t micro_batch = 1;                   // samples per micro-batch: the leaf of the step's tree
  int64_t bucket_bytes = int64_t{25} << 20;  // gradient bytes per all-reduce (PyTorch's bucket_cap_mb)
  int64_t first_bucket_bytes = int64_t{1} << 20;
  // ZeRO: 1 shards the optimizer state across the ranks, 2 the reduced gradients as well,
  // 3 the weights too.
  int zero_stage = 0;
  // ZeRO-3: the type names of the modules gathered one at a time (FSDP's wrapped modules,
  // e.g. {"GptBlock"}); empty: the root's children. See parameter_gathering.h.
  std::vector<std::string> zero3_unit_types = {};
  // Ranks that share host memory (`shm` processes, `local` threads) on CPU devices keep one
  // copy of the weights, and each steps its parts of it. false: each rank keeps its own, as
  // GPU ranks do — for ranks on different NUMA nodes, which would otherwise read the one
  // copy across the socket link.
  bool share_weights = true;
  // GPU ranks: the type matrix products read (bf16, f16; core/autocast.h); f16 also scales
  // the loss (optim/loss_scaler.h) and skips steps whose gradients overflow — under ZeRO,
  // where each rank holds a shard of the sums, once the ranks agree (sharded_loss_scaling.h).
  DType precision = DType::f32;
  // The type gradients cross between ranks in: f32, or bf16 for half the bytes on a slow
  // link. Under bf16 every node of the step's tree — each micro-batch's gradients, each
  // partial sum, on a rank and across ranks (comm's rounded_sum) — is rounded to bf16, so
  // the weights still do not depend on the rank count; they differ from f32's. CPU devices,
  // without ZeRO.
  DType gradient_dtype = DType::f32;
  // Local SGD: above 1, each rank steps its own optimizer on its own share's gradients (the
  // share's mean, nothing communicated), and after every sync_every-th step of the run the
  // ranks' weights, buffers and optimizer state are averaged in the tree's order (one
  // all-reduce each). The weights then depend on the rank count (each replica follows its
  // own data between averagings), never on hosts, placement or a resume; one rank gives
  // plain ddp's bits. Not with ZeRO or a bf16 gradient_dtype.
  int64_t sync_every = 1;
  // PowerSGD (powersgd.h): gradients cross as rank-`powersgd_rank` approximations with error
  // feedback from step `powersgd_start_step` of the run on (plain all-reduces before: the
  // warm-up PyTorch's start_powerSGD_iter gives); 0: off. Replicas stay equal; the weights
  // depend on the rank count. CPU devices, without ZeRO, local SGD or bf16 gradients.
  int powersgd_rank = 0;
  int64_t powersgd_start_step = 10;
};

// A contiguous range of the flat gradient buffer, reduced by one collective: a unit of the
// buffer (flat_gradients.h), padded to a multiple of the rank count.
using GradientBucket = FlatUnit;

class DistributedDataParallel final : public Layout {
 public:
  // model: this rank's replica; make_optimizer(params): an elementwise optimizer (SGD,
  // AdamW) over the model's parameters, or over this rank's parts of the flat buffer (ZeRO,
  // or ranks that share memory).
  // The communicator's ranks are the devices. Collective (rank 0's weights are broadcast).
  DistributedDataParallel(std::shared_ptr<nn::Module> model, const OptimizerFactory& make_optimizer,
                          std::shared_ptr<comm::Communicator> comm, const DistributedDataParallelOptions& options);
  ~DistributedDataParallel() override;
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // One optimizer step on the global batch (the same on every rank): this rank trains on
  // its contiguous share, rows [rank * b, (rank + 1) * b) for b = size / ranks.
  StepResult step(const TensorBatch& global_batch, const StepContext& context) override;
  // The same step for a program that loads only this rank's share of the global batch
  // (b samples, the same b on every rank); context.first_sample is the global index of the
  // share's first sample. A rank whose share runs out of device memory (OutOfMemoryError)
  // before the update still makes the collectives it owes the others, with placeholder
  // data, and every rank then learns of it at the step's agreement (step_agreement.h): all
  // of them drop the step, change nothing, and throw OutOfMemoryError naming the rank that
  // ran out, so a training loop on every rank may take it again with a smaller micro-batch
  // (set_micro_batch). Any other error on one rank (and out of memory under ZeRO-3, local
  // SGD, or once the update has begun) aborts the communicator, so the others stop at once
  // instead of waiting for it.
  StepResult step_on_share(const TensorBatch& share, const StepContext& context);

  int64_t micro_batch() const override { return options_.micro_batch; }
  // Accepted where a step that ran out of memory is agreed on and changes nothing (ddp and
  // ZeRO 1 and 2, PowerSGD included), whenever the global batch splits into it. Refused
  // under ZeRO-3 (its gathers inside forward and backward cannot be made by a rank that
  // ran out midway), under local SGD (its steps send nothing to agree through), and after
  // an error ended the ranks' group. Not collective: every rank calls it alike after the
  // same agreed failure, and decides alike.
  std::string set_micro_batch(int64_t micro_batch, int64_t global_batch) override;
  // Collective under ZeRO-3: the weights are gathered, and stay so until the next step.
  nn::Module& model() override;
  // Collective where the ranks share one copy of the weights.
  void load_model_state(const NamedTensors& state) override;
  std::vector<Device> local_devices() const override;
  int64_t max_over_processes(int64_t value) override;
  void give_up(const std::string& reason) override;
  bool replicas_agree() const override { return replicas_agree_; }
  void average_replicas() override;
  comm::Communicator& communicator() { return *comm_; }
  void set_lr(double lr) override;
  double lr() const override;
  // The optimizer state as one unsharded optimizer over the parameters holds it (under
  // ZeRO gathered from every rank: collective), and its loading.
  NamedTensors optimizer_state() override;
  void load_optimizer_state(const NamedTensors& state) override;
  NamedTensors optimizer_state_on(int root) override;
  // Bytes of optimizer state this rank holds (1/size() of the whole under ZeRO).
  int64_t optimizer_state_bytes() const;
  const std::vector<GradientBucket>& buckets() const { return buckets_; }

 private:
  // The step; returns the agreed failure ("" when every rank finished its share), after
  // which nothing has changed.
  std::string run_step(const TensorBatch& share, const StepContext& context, StepResult& result);
  // This rank's forward and backward over its share, the bucket collectives started; into
  // `losses` each micro-batch's loss and running statistics. May run out of memory.
  void compute_share(const TensorBatch& share, const StepContext& context, int64_t normalizer, GradientTree& losses);
  // After the agreement: the reduced gradients and statistics applied, the optimizer stepped.
  void update(const std::vector<Tensor>& statistic_sums, const StepContext& context, StepResult& result);
  // Whether an out-of-memory error before the update is agreed on (else it ends the group).
  bool agrees_on_failures() const { return options_.zero_stage < 3 && !local_sgd(); }
  // Why a step cannot be taken again with another micro-batch; "" where it can.
  std::string why_micro_batch_is_fixed() const;
  // This rank's part of a failed step dropped: its gradients, partial sums, buckets and
  // statistics. Buffers a collective still reads stay alive until it is done.
  void abandon_step();
  // A rank that ran out of memory makes the bucket collectives it has not started, in
  // order, on placeholder buffers, so its peers' calls are matched and none waits for it.
  void pay_owed_collectives();
  void on_gradient_ready(size_t param);
  // Moves a parameter's final gradient (zeros if it has none) into its bucket.
  void take_gradient(size_t param);
  void clear_grad_destinations();  // those backward did not reach keep none for later
  void start_ready_buckets();
  // ZeRO-2 and 3: bucket b's buffer, made (padding zeroed, its weights' gradient destinations
  // set) if it does not exist yet; buffers whose reduce-scatter is done are released.
  const Tensor& bucket_buffer(size_t b);
  void release_sent_buckets();
  void wait_for_collectives();
  void unpack_wire();  // the reduced bf16 buckets back into last_leaf_
  bool local_sgd() const { return options_.sync_every > 1; }
  // Whether this step's gradients cross as PowerSGD's approximations.
  bool compresses(const StepContext& context) const {
    return powersgd_ && context.step >= static_cast<uint64_t>(options_.powersgd_start_step);
  }
  // Plain ddp's state, and PowerSGD's added to it: gathered on root, or on every rank (-1).
  NamedTensors own_optimizer_state();
  void add_powersgd_state(NamedTensors& state, int root);
  // In place, every rank's tensors become the ranks' average: f32 tensors in one call.
  void average(const std::vector<Tensor>& tensors);

  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<comm::Communicator> comm_;
  DistributedDataParallelOptions options_;
  GatherPlan gather_plan_;  // ZeRO-3's units (its buckets)
  FlatGradients gradients_;
  StepStatistics statistics_;                      // the model's running statistics
  std::unique_ptr<optim::Optimizer> optimizer_;    // unsharded
  std::unique_ptr<ShardedOptimizer> sharded_;      // ZeRO, or ranks that share memory
  std::unique_ptr<ParameterGathering> gathering_;  // ZeRO-3
  std::optional<optim::LossScaler> scaler_;        // f16
  std::vector<GradientBucket> buckets_;
  std::vector<size_t> bucket_of_;  // per parameter

  Tensor reduced_;  // where the final micro-batch's gradients are reduced, every step (ZeRO 0 and 1)
  Tensor wire_;     // under a bf16 gradient_dtype: what the all-reduce moves, bucket by bucket

  // The step in flight.
  GradientTree tree_;
  Tensor last_leaf_;                               // the final micro-batch's gradients, reduced bucket by bucket
  Tensor grad_shard_;                              // ZeRO-2 and 3: this rank's part of every reduced bucket
  std::vector<Tensor> bucket_buffers_;             // ZeRO-2 and 3: per bucket, its final gradients while filled
  std::optional<GradientCollector> accumulating_;  // an earlier micro-batch's gradients
  bool collecting_ = false;                        // inside the final micro-batch's backward
  std::vector<bool> taken_;                        // per parameter: its gradient is in last_leaf_
  std::vector<size_t> missing_;                    // per bucket: parameters not yet taken
  size_t next_bucket_ = 0;                         // buckets start in order
  std::vector<comm::Work> works_;
  std::vector<Tensor> sending_;  // ZeRO-2: per work, the bucket it reads (released when done)
  size_t released_ = 0;          // ZeRO-2: works whose bucket is released
  bool replicas_agree_ = true;   // false between local SGD's averagings
  std::unique_ptr<PowerSgd> powersgd_;
  bool hold_buckets_ = false;         // this step reduces after backward (local SGD, PowerSGD)
  std::vector<Tensor> placeholders_;  // a failed step's stand-ins for what it owed, until sent
  bool group_ended_ = false;          // an error aborted the communicator
  // Offload's overlapped update of optimizer_: the model's readers wait for it (destroyed
  // first, so it waits before the optimizer and the model go).
  std::unique_ptr<optim::ParameterReadGuard> read_guard_;
};

}  // namespace lockstep::parallel
