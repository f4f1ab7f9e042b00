// One device's rank of a GPT trained on a D × T × P device mesh (device_mesh.h): its
// pipeline stage's blocks, cut across its tensor-parallel group (gpt_stage.h), trained on
// its data-parallel replica's share of each global batch.
//
// A step follows the step's tree (step.h): the replica's contiguous run of micro-batches
// streams through the stages under a GPipe or 1F1B schedule (pipeline_schedule.h),
// activations forward and their gradients backward by send/recv; each stage folds its
// micro-batch gradients into a GradientTree in micro-batch order, the replicas' subtrees are
// all-reduced in tree order, and every rank steps its own parameters (under ZeRO-1, its
// shard of them: reduce-scatter, step, all-gather over its data-parallel group). The head
// tied to the token embedding lives on the last stage as a copy: its gradient goes to the
// first stage after each micro-batch (summed there as one device sums the two uses) and the
// trained weight comes back after each step. Without tensor parallelism, the weights are the same
// bits as on one device for the same (seed, global batch, micro-batch); with it, the sums of
// partial products round differently.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/nn/gpt.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/device_mesh.h"
#include "lockstep/parallel/gpt_stage.h"
#include "lockstep/parallel/pipeline_schedule.h"
#include "lockstep/parallel/sharded_optimizer.h"
#include "lockstep/parallel/step.h"

namespace lockstep::parallel {

struct GptMeshOptions {
  MeshShape mesh;
  std::vector<int64_t> blocks_per_stage;  // empty: balanced by parameter count
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int64_t micro_batch = 1;
  bool checkpoint_activations = false;
  // 0: every rank steps all its parameters with an optimizer of its own. 1 (ZeRO-1): the
  // optimizer state of each rank's parameters is cut across its data-parallel group (the
  // ranks that hold the same stage and tensor-parallel shard), a ShardedOptimizer over that
  // group with weights of each rank's own: the replicas' sums are reduce-scattered instead
  // of all-reduced, each rank steps its shard and all-gathers the weights. The same bits as
  // 0, with 1/D of the optimizer state. Stage 2 is not built for the mesh.
  int zero_stage = 0;
  // GPU ranks: bf16 rounds the matrix products' operands inside forward and backward
  // (core/autocast.h), as data parallelism does; f32 computes in f32. f16 would need a
  // loss scale the whole pipeline agrees on, and is not built for the mesh.
  DType precision = DType::f32;
};

// "" when the model cuts into the layout, else what does not divide what and how to fix it
// (heads and vocabulary by --tp, blocks into --pp stages, the given stage sizes).
std::string check_gpt_mesh(const nn::GptConfig& config, const GptMeshOptions& options);

// Blocks per stage for the options: the given ones, or balanced by parameters.
std::vector<int64_t> gpt_blocks_per_stage(const nn::GptConfig& config, const GptMeshOptions& options);

class GptMeshRank {
 public:
  // Collective over `world` (mesh.size() ranks): builds the groups, then this rank's stage
  // from `full` (every rank passes the same weights) on `device`, and its optimizer.
  GptMeshRank(const nn::Gpt& full, const GptMeshOptions& options, std::shared_ptr<comm::Communicator> world,
              Device device, const OptimizerFactory& make_optimizer);

  // One optimizer step on the global batch, tokens and targets [B, T] (every rank is given
  // all of it and takes its replica's share), whose first sample has global index
  // first_sample. Collective over the mesh. The loss is the mean cross-entropy over the
  // global batch, the same on every rank; devices[0] is this rank's time.
  StepResult step(const Tensor& tokens, const Tensor& targets, int64_t first_sample, uint64_t step, uint64_t seed);

  const DeviceMesh& mesh() const { return mesh_; }
  GptStage& stage() { return *stage_; }
  const GptStage& stage() const { return *stage_; }
  // The optimizer over this rank's parameters (zero_stage 0), or over its shards of them
  // (zero_stage 1: the sharded optimizer's own).
  optim::Optimizer& optimizer() { return sharded_ ? sharded_->optimizer() : *optimizer_; }
  const optim::Optimizer& optimizer() const { return sharded_ ? sharded_->optimizer() : *optimizer_; }
  // zero_stage 1: the optimizer sharded across the data-parallel group; else null.
  ShardedOptimizer* sharded_optimizer() { return sharded_.get(); }
  void set_lr(double lr) { optimizer().set_lr(lr); }
  double lr() const { return optimizer().lr(); }
  // Bytes of optimizer state this rank holds (under ZeRO-1, its shard's).
  int64_t optimizer_state_bytes() const { return optimizer().state_bytes(); }
  // Blocks per pipeline stage, and of the last step: the micro-batches each replica ran and
  // the most whose activations this rank held at once.
  const std::vector<int64_t>& blocks_per_stage() const { return blocks_per_stage_; }
  int64_t micro_batches() const { return micro_batches_; }
  int64_t most_in_flight() const { return most_in_flight_; }

  // Checkpoints hold the full model whatever the layout. Collective over the whole mesh:
  // every rank gets the full model's parameters (its names, in its order, on cpu:0), and
  // the optimizer state as one unsharded optimizer over them holds it.
  NamedTensors gather_full_weights();
  NamedTensors gather_full_optimizer_state();
  // The same, assembled on world rank `root` alone from the pieces each rank sends (the
  // others get an empty list and never hold more than their own part): what a checkpoint
  // needs. The same entries and bits as above.
  NamedTensors gather_full_weights_on(int root);
  NamedTensors gather_full_optimizer_state_on(int root);
  // Takes this rank's part of them (no communication; under ZeRO-1 its shard of the
  // optimizer state).
  void load_full_weights(const NamedTensors& weights);
  void load_full_optimizer_state(const NamedTensors& optimizer_state);

 private:
  // Whether this rank's copy of a parameter cut as `spec` is the one the gathers take:
  // replica 0's, and of a replicated tensor, tensor-parallel rank 0's.
  bool owns(const ShardSpec& spec) const;
  // The shape of one tensor-parallel shard of full parameter `parameter` along `axis`.
  Shape shard_shape(size_t parameter, int64_t axis) const;
  // The optimizer state as one unsharded optimizer over this rank's parameters keys it
  // ("step", "state.<local index>.<slot>"). Under ZeRO-1 it is gathered over the
  // data-parallel group onto replica 0's rank (collective over the group): the other
  // replicas get "step" alone, which is all the mesh's gathers take from them.
  NamedTensors unsharded_optimizer_state();

  GptMeshOptions options_;
  DeviceMesh mesh_;
  Device device_;
  std::unique_ptr<GptStage> stage_;
  std::unique_ptr<FlatGradients> gradients_;
  size_t tied_index_ = 0;  // first stage of several: the embedding's place among the parameters
  // zero_stage 0: optimizer_; 1: sharded_, over gradients_ and the data-parallel group.
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<ShardedOptimizer> sharded_;
  std::vector<std::pair<std::string, Shape>> full_parameters_;  // the full model's, in order
  std::vector<size_t> full_index_;                              // per local parameter, its index among full_parameters_
  std::vector<int64_t> blocks_per_stage_;
  int64_t micro_batches_ = 0, most_in_flight_ = 0;
};

}  // namespace lockstep::parallel
