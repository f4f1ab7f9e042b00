#include "lockstep/parallel/gpt_mesh.h"

#include <algorithm>
#include <sstream>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/comm/flight_recorder.h"
#include "lockstep/core/autocast.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/gradient_collector.h"
#include "lockstep/parallel/gradient_tree.h"
#include "lockstep/parallel/stage_links.h"

namespace lockstep::parallel {
namespace {

// Point-to-point tags: each pair of stages sees its messages in the order sent, and the
// tag checks that both sides agree on what comes next.
enum Tag : int { kActivation = 0, kGradient = 1, kTiedGradient = 2, kTiedWeight = 3 };

}  // namespace

std::string check_gpt_mesh(const nn::GptConfig& config, const GptMeshOptions& options) {
  std::ostringstream error;
  const int tp = options.mesh.tp, pp = options.mesh.pp;
  int64_t given = 0;
  for (const int64_t n : options.blocks_per_stage) given += n;
  if (options.zero_stage == 2) {
    error << "ZeRO stage 2 (the reduced gradients sharded too) is not built for the GPT mesh: use zero_stage 1 "
             "(lockstep train --strategy zero1 with --dp/--tp/--pp), or ZeRO-2 under distributed data parallelism "
             "(--strategy zero2 without --dp/--tp/--pp)";
  } else if (options.precision != DType::f32 && options.precision != DType::bf16) {
    error << "the GPT mesh computes in f32 or bf16 (matrix products on GPUs), not " << dtype_name(options.precision)
          << ": f16 needs a loss scale that every stage agrees on; use bf16, or f16 with data parallelism";
  } else if (options.zero_stage != 0 && options.zero_stage != 1) {
    error << "the GPT mesh's ZeRO stage must be 0 (every rank steps all its parameters) or 1 (the optimizer state "
             "sharded across each data-parallel group), got "
          << options.zero_stage;
  } else if (config.heads % tp != 0) {
    error << "tensor parallelism cuts attention by heads: " << config.heads << " heads do not go to " << tp
          << " ranks; use a --tp that divides " << config.heads << " (or change --heads)";
  } else if (config.vocab % tp != 0) {
    error << "tensor parallelism cuts the vocabulary: " << config.vocab << " tokens do not go to " << tp
          << " ranks; use a --tp that divides " << config.vocab;
  } else if (config.layers < pp) {
    error << config.layers << " transformer blocks cannot fill " << pp
          << " pipeline stages (each stage holds at least one block): use --pp at most " << config.layers
          << " or a model with more --layers";
  } else if (!options.blocks_per_stage.empty() &&
             (static_cast<int>(options.blocks_per_stage.size()) != pp || given != config.layers ||
              *std::min_element(options.blocks_per_stage.begin(), options.blocks_per_stage.end()) < 1)) {
    error << "the stage sizes give " << options.blocks_per_stage.size() << " stage(s) holding " << given
          << " block(s); the model has " << config.layers << " blocks in " << pp << " pipeline stages: give " << pp
          << " positive counts that sum to " << config.layers;
  }
  return error.str();
}

std::vector<int64_t> gpt_blocks_per_stage(const nn::GptConfig& config, const GptMeshOptions& options) {
  const std::string error = check_gpt_mesh(config, options);
  LOCKSTEP_CHECK(error.empty()) << error;
  if (!options.blocks_per_stage.empty()) return options.blocks_per_stage;
  const int64_t w = config.width;
  const int64_t block = 12 * w * w + 13 * w;  // c_attn, c_proj, c_fc, c_proj with biases, two layer norms
  return balance_stages(config.layers, block, (config.vocab + config.context) * w, 2 * w, options.mesh.pp);
}

GptMeshRank::GptMeshRank(const nn::Gpt& full, const GptMeshOptions& options, std::shared_ptr<comm::Communicator> world,
                         Device device, const OptimizerFactory& make_optimizer)
    : options_(options), mesh_(std::move(world), options.mesh), device_(device) {
  LOCKSTEP_CHECK(options.micro_batch >= 1)
      << "the micro-batch must hold at least one sample, got " << options.micro_batch;
  check_precision(options.precision, device);
  blocks_per_stage_ = gpt_blocks_per_stage(full.config, options);
  const std::vector<GptStagePlan> plans = gpt_stage_plans(blocks_per_stage_);
  stage_ = std::make_unique<GptStage>(full, plans.at(static_cast<size_t>(mesh_.coord().pp)), mesh_.tp_group());
  stage_->checkpoint_activations = options.checkpoint_activations;
  // Each rank's part lives on its own device, so memory_stats(device) is that device's memory.
  for (const Tensor& p : stage_->parameters()) p.set_data(p.to(device));
  if (stage_->last() && !stage_->first()) stage_->head_weight.set_data(stage_->head_weight.to(device));
  for (const auto& [name, parameter] : full.named_parameters()) full_parameters_.emplace_back(name, parameter.shape());
  for (const ShardSpec& spec : stage_->shard_specs()) {
    size_t f = 0;
    while (f < full_parameters_.size() && full_parameters_[f].first != spec.full_name) ++f;
    LOCKSTEP_CHECK(f < full_parameters_.size())
        << "GptStage parameter " << spec.full_name << " is not the full model's";
    full_index_.push_back(f);
  }
  // Under ZeRO-1 the flat buffer is padded so that it cuts into one part per replica.
  const int shards = options.zero_stage == 1 ? options.mesh.dp : 1;
  gradients_ = std::make_unique<FlatGradients>(stage_->parameters(), shards);
  if (stage_->first() && !stage_->last()) {
    // The embedding: the head's use of it arrives from the last stage.
    const std::vector<Tensor>& params = gradients_->params();
    tied_index_ = static_cast<size_t>(
        std::find_if(params.begin(), params.end(),
                     [&](const Tensor& p) { return p.impl_ptr() == stage_->head_weight.impl_ptr(); }) -
        params.begin());
    LOCKSTEP_CHECK(tied_index_ < params.size()) << "GptMeshRank: the first stage's head weight is not its embedding";
  }
  if (options.zero_stage == 1) {
    // Mesh ranks keep weights of their own (as GPU ranks do): the parts are all-gathered.
    sharded_ = std::make_unique<ShardedOptimizer>(*gradients_, *mesh_.dp_group(), make_optimizer,
                                                  /*share_weights=*/false);
  } else {
    optimizer_ = make_optimizer(stage_->parameters());
  }
}

StepResult GptMeshRank::step(const Tensor& tokens, const Tensor& targets, int64_t first_sample, uint64_t step,
                             uint64_t seed) {
  StepResult outcome;
  outcome.devices.resize(1);
  DeviceTimes& times = outcome.devices[0];
  StepClock::time_point start = StepClock::now();
  times.started = std::chrono::duration<double>(start.time_since_epoch()).count();
  const MeshShape& shape = mesh_.shape();
  const int64_t batch = tokens.size(0), context = tokens.size(1), micro = options_.micro_batch;
  LOCKSTEP_CHECK(tokens.dim() == 2 && targets.shape() == tokens.shape())
      << "GptMeshRank: tokens and targets must both be [batch, time], got " << shape_str(tokens.shape()) << " and "
      << shape_str(targets.shape());
  const std::string layout_error = check_step_layout(batch, micro, shape.dp);
  LOCKSTEP_CHECK(layout_error.empty()) << layout_error;
  const int64_t share = batch / shape.dp, first = mesh_.coord().dp * share, micro_batches = share / micro;
  const int stage = mesh_.coord().pp, stages = shape.pp;
  GptStage& part = *stage_;
  comm::Communicator& pp = *mesh_.pp_group();
  // Each prediction weighs 1/(batch · T): the loss is the mean over the global batch.
  const double weight = static_cast<double>(batch * context);

  struct InFlight {
    Tensor input, output;  // output: the loss sum on the last stage
  };
  std::vector<InFlight> in_flight(static_cast<size_t>(micro_batches));
  StageLinks links(pp, times);
  GradientTree tree;
  // Tensor parallelism all-reduces inside forward and backward: counted as communication.
  const double tp_before = mesh_.tp_group()->blocking_seconds();
  const std::vector<PipelineOp> ops = pipeline_ops(options_.schedule, stage, stages, micro_batches);
  micro_batches_ = micro_batches;
  most_in_flight_ = parallel::most_in_flight(ops);
  for (const PipelineOp& op : ops) {
    InFlight& slot = in_flight[static_cast<size_t>(op.micro_batch)];
    comm::FlightRecorder::process().set_micro_batch(op.micro_batch);
    const comm::FlightPhase phase(op.forward ? "forward" : "backward");
    const int64_t row = first + op.micro_batch * micro;
    if (op.forward) {
      if (part.first()) {
        slot.input = slice(tokens, 0, row, row + micro).to(device_);
      } else {
        slot.input = Tensor::empty({micro, context, part.config.width}, DType::f32, device_);
        links.recv(slot.input, stage - 1, kActivation);
        slot.input.set_requires_grad(true);
      }
      const StepClock::time_point compute = StepClock::now();
      part.set_forward_context({.seed = seed, .step = step, .first_sample = first_sample + row});
      const AutocastGuard autocast(options_.precision);
      const Tensor output = part.forward(slot.input);
      slot.output = part.last() ? part.loss_sum(output, slice(targets, 0, row, row + micro).to(device_)) : output;
      times.compute += seconds_since(compute);
      if (!part.last()) links.send(slot.output.detach(), stage + 1, kActivation);
      continue;
    }
    Tensor gradient;
    if (part.last()) {
      gradient = Tensor::scalar(1.0 / weight).to(device_);
    } else {
      gradient = Tensor::empty(slot.output.shape(), DType::f32, device_);
      links.recv(gradient, stage + 1, kGradient);
    }
    StepClock::time_point compute = StepClock::now();
    GradientCollector collected(*gradients_);
    {
      const AutocastGuard autocast(options_.precision);  // recomputed blocks round as their forward did
      slot.output.backward(gradient);
    }
    times.compute += seconds_since(compute);
    if (!part.first()) links.send(slot.input.grad(), stage - 1, kGradient);
    if (part.last() && !part.first()) {
      links.send(part.head_weight.grad(), 0, kTiedGradient);
      part.head_weight.set_grad(Tensor());
    }
    std::vector<Tensor> leaf{collected.finish()};
    if (part.first() && !part.last()) {
      // The head's use of the tied weight, added to the embedding's as one device adds them.
      const Tensor head = Tensor::empty(part.head_weight.shape(), DType::f32, device_);
      links.recv(head, stages - 1, kTiedGradient);
      NoGradGuard no_grad;
      const Tensor tied = gradients_->view(leaf[0], tied_index_);
      tied.copy_from(tied + head);
    }
    compute = StepClock::now();
    // The micro-batch's loss, divided where it lies (f32 to f64 is exact; one IEEE division,
    // as run_micro_batch does), so a GPU stage does not wait for it.
    if (part.last()) {
      leaf.push_back(
          div(reshape(slot.output.detach(), {1}).to(DType::f64), Tensor::full({1}, weight, DType::f64, device_)));
    }
    tree.add_leaf(std::move(leaf));
    slot = InFlight{};  // this micro-batch's activations go now
    times.compute += seconds_since(compute);
  }
  std::vector<Tensor> sums = tree.finish();
  const double tensor_parallel = mesh_.tp_group()->blocking_seconds() - tp_before;
  times.compute -= tensor_parallel;
  times.communicate += tensor_parallel;
  links.finish();

  // The top of the tree: the replicas' subtrees, in tree order.
  comm::Communicator& dp = *mesh_.dp_group();
  start = StepClock::now();
  dp.barrier();  // so the wait for the slowest replica is not counted as communication
  times.wait = seconds_since(start);
  start = StepClock::now();
  if (!sharded_) dp.all_reduce(sums[0]);  // ZeRO-1 reduce-scatters them in its step
  const Tensor loss = part.last() ? sums[1] : Tensor::zeros({1}, DType::f64, device_);
  if (part.last()) dp.all_reduce(loss);
  pp.broadcast(loss, stages - 1);
  outcome.loss = loss.item();
  times.communicate += seconds_since(start);

  if (sharded_) {
    // Reduce-scatter in tree order, step this rank's shard, all-gather the weights.
    const comm::FlightPhase phase("optimizer");
    sharded_->step(sums[0], times);
  } else {
    start = StepClock::now();
    gradients_->give(sums[0]);
    {
      const comm::FlightPhase phase("optimizer");
      optimizer_->step();
    }
    optimizer_->zero_grad();
    times.optimizer = seconds_since(start);
  }
  sums.clear();
  start = StepClock::now();
  if (part.first() && !part.last()) pp.send(part.head_weight, stages - 1, kTiedWeight);
  if (part.last() && !part.first()) pp.recv(part.head_weight, 0, kTiedWeight);
  times.communicate += seconds_since(start);
  return outcome;
}

}  // namespace lockstep::parallel
