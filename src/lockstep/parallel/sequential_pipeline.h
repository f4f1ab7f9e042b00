// Pipeline parallelism for any nn::Sequential: one rank of a D × P mesh (D data-parallel
// replicas of P pipeline stages, device_mesh.h with tp = 1). Stage s runs a contiguous run of
// the Sequential's layers — cut by the user (layers per stage) or balanced by parameter
// count — on its own device. A step follows the step's tree (step.h): each replica's run of
// micro-batches streams through the stages under GPipe or 1F1B (pipeline_schedule.h), the
// activations forward and their gradients backward by send/recv (each preceded by a small
// header with its dtype and shape, so layers may change either), the last stage computes
// the user's per-sample loss of the output (loss_function.h, OutputLoss), every stage folds
// its layers' gradients (and running statistics) in micro-batch order, the replicas add
// their subtrees in tree order, and every rank steps its own layers. The weights are the same
// bits as one device's for the same (seed, global batch, micro-batch).
//
// Every rank holds the whole model (its own copy, from the same weights); its stage's layers
// are the live ones. gather_full() brings every rank's copy up to date, for a checkpoint or
// an evaluation.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/nn/sequential.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/device_mesh.h"
#include "lockstep/parallel/flat_gradients.h"
#include "lockstep/parallel/loss_function.h"
#include "lockstep/parallel/pipeline_schedule.h"
#include "lockstep/parallel/sharded_optimizer.h"
#include "lockstep/parallel/step.h"
#include "lockstep/parallel/step_statistics.h"

namespace lockstep::parallel {

// How the first stage makes its input from a micro-batch, for a model with several inputs
// (concatenated, stacked, ...); it sees the data only, never the model's parameters.
using StageInput = std::function<Tensor(const TensorBatch& micro_batch)>;

struct SequentialPipelineOptions {
  std::string input = "";                      // the batch field the first layer reads, or:
  StageInput make_input = nullptr;             // the first layer's input made from several fields
  OutputLoss loss = nullptr;                   // per-sample losses of the last layer's output
  int replicas = 1, stages = 2;                // D and P
  std::vector<int64_t> layers_per_stage = {};  // empty: balanced by parameter count
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int64_t micro_batch = 1;
};

// Layers per stage for `model` under `options`: the given ones (checked: P positive counts
// summing to the layer count; the Error says what sums to what), or balanced.
std::vector<int64_t> sequential_stage_sizes(const nn::Sequential& model, const SequentialPipelineOptions& options);

class SequentialPipelineRank {
 public:
  // Collective over `world` (replicas × stages ranks). `model` is this rank's copy of the
  // whole model (every rank's with the same weights); its stage's layers move to `device`.
  SequentialPipelineRank(std::shared_ptr<nn::Sequential> model, const SequentialPipelineOptions& options,
                         std::shared_ptr<comm::Communicator> world, Device device,
                         const OptimizerFactory& make_optimizer);

  // One optimizer step on the global batch (every rank is given all of it and takes its
  // replica's share); context.first_sample is the global index of its first sample. The
  // loss is the global batch's mean, the same on every rank. Collective over the mesh.
  StepResult step(const TensorBatch& global_batch, const StepContext& context);

  const DeviceMesh& mesh() const { return mesh_; }
  int stage() const { return mesh_.coord().pp; }
  // Layers [first, end) of the Sequential are this rank's.
  int64_t first_layer() const { return first_; }
  int64_t end_layer() const { return end_; }
  const std::vector<int64_t>& layers_per_stage() const { return sizes_; }
  nn::Sequential& model() { return *model_; }
  optim::Optimizer& optimizer() { return *optimizer_; }

  // Collective over the mesh: every rank's copy of the whole model takes the live weights
  // and buffers of the stages that own them (replica 0's), and the optimizer state of every
  // stage is gathered as one unsharded optimizer over the whole model's parameters holds it.
  void gather_full();
  NamedTensors gather_full_optimizer_state();
  // Takes this stage's part of a whole model's unsharded optimizer state (no communication);
  // a whole state_dict loads with model().load_state_dict.
  void load_full_optimizer_state(const NamedTensors& optimizer_state);

 private:
  std::shared_ptr<nn::Sequential> model_;
  SequentialPipelineOptions options_;
  DeviceMesh mesh_;
  Device device_;
  std::vector<int64_t> sizes_;
  int64_t first_ = 0, end_ = 0;
  std::vector<Tensor> params_;      // this stage's layers' parameters, in the model's order
  std::vector<size_t> full_index_;  // per local parameter, its index among the model's
  std::unique_ptr<FlatGradients> gradients_;
  StepStatistics statistics_;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace lockstep::parallel
