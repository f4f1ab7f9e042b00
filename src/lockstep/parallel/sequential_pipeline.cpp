#include "lockstep/parallel/sequential_pipeline.h"

#include <optional>
#include <sstream>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/comm/flight_recorder.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/gradient_collector.h"
#include "lockstep/parallel/gradient_tree.h"
#include "lockstep/parallel/stage_links.h"

namespace lockstep::parallel {
namespace {

// Point-to-point tags: each pair of stages sees its messages in the order sent, and the tag
// checks that both sides agree on what comes next.
enum Tag : int { kHeader = 10, kActivation = 11, kGradient = 12 };

// What a receiver needs to allocate a tensor: its dtype and shape, as 8 i64 values.
constexpr int64_t kHeaderLength = 8, kMostAxes = kHeaderLength - 2;

Tensor header_of(const Tensor& tensor) {
  LOCKSTEP_CHECK(tensor.dim() <= kMostAxes) << "a pipeline stage passes on " << shape_str(tensor.shape())
                                            << ": at most " << kMostAxes << " axes go between stages";
  std::vector<int64_t> header(kHeaderLength, 0);
  header[0] = static_cast<int64_t>(tensor.dtype());
  header[1] = tensor.dim();
  for (int64_t a = 0; a < tensor.dim(); ++a) header[static_cast<size_t>(2 + a)] = tensor.size(a);
  return Tensor::from_vector(header, {kHeaderLength});
}

Tensor empty_like_header(const Tensor& header, Device device) {
  const std::vector<int64_t> h = header.to_vector<int64_t>();
  const Shape shape(h.begin() + 2, h.begin() + 2 + h[1]);
  return Tensor::empty(shape, static_cast<DType>(h[0]), device);
}

std::vector<int64_t> layer_parameter_counts(const nn::Sequential& model) {
  std::vector<int64_t> counts;
  for (size_t i = 0; i < model.size(); ++i) counts.push_back(model[i]->num_parameters());
  return counts;
}

}  // namespace

std::vector<int64_t> sequential_stage_sizes(const nn::Sequential& model, const SequentialPipelineOptions& options) {
  const auto layers = static_cast<int64_t>(model.size());
  if (options.layers_per_stage.empty()) return balance_layers(layer_parameter_counts(model), options.stages);
  int64_t given = 0;
  bool positive = true;
  for (const int64_t n : options.layers_per_stage) {
    given += n;
    positive = positive && n >= 1;
  }
  LOCKSTEP_CHECK(static_cast<int>(options.layers_per_stage.size()) == options.stages && given == layers && positive)
      << "the stage sizes give " << options.layers_per_stage.size() << " stage(s) holding " << given
      << " layer(s); the Sequential has " << layers << " layers in " << options.stages << " pipeline stages: give "
      << options.stages << " positive counts that sum to " << layers;
  return options.layers_per_stage;
}

SequentialPipelineRank::SequentialPipelineRank(std::shared_ptr<nn::Sequential> model,
                                               const SequentialPipelineOptions& options,
                                               std::shared_ptr<comm::Communicator> world, Device device,
                                               const OptimizerFactory& make_optimizer)
    : model_(std::move(model)),
      options_(options),
      mesh_(std::move(world), MeshShape{.dp = options.replicas, .tp = 1, .pp = options.stages}),
      device_(device),
      statistics_(*model_) {
  LOCKSTEP_CHECK(options.loss) << "SequentialPipelineRank has no loss: set SequentialPipelineOptions::loss, the "
                                  "per-sample loss of the last layer's output (e.g. parallel::cross_entropy_loss_of("
                                  "\"target\")), see parallel/loss_function.h";
  LOCKSTEP_CHECK(options.input.empty() != (options.make_input == nullptr))
      << "SequentialPipelineRank: name the batch field the first layer reads (SequentialPipelineOptions::input), "
         "or give make_input to build it from several fields; not both";
  LOCKSTEP_CHECK(options.micro_batch >= 1)
      << "the micro-batch must hold at least one sample, got " << options.micro_batch;
  sizes_ = sequential_stage_sizes(*model_, options);
  for (int s = 0; s < stage(); ++s) first_ += sizes_[static_cast<size_t>(s)];
  end_ = first_ + sizes_[static_cast<size_t>(stage())];

  // The stage's layers live on its device; their parameters' positions in the whole model.
  int64_t index = 0;
  for (int64_t layer = 0; layer < static_cast<int64_t>(model_->size()); ++layer) {
    const nn::Module& child = *(*model_)[static_cast<size_t>(layer)];
    const std::vector<Tensor> own = child.parameters();
    if (layer >= first_ && layer < end_) {
      for (size_t p = 0; p < own.size(); ++p) {
        params_.push_back(own[p]);
        full_index_.push_back(static_cast<size_t>(index) + p);
      }
    }
    index += static_cast<int64_t>(own.size());
  }
  LOCKSTEP_CHECK(index == static_cast<int64_t>(model_->parameters().size()))
      << "the Sequential's layers share parameters (tied weights): a pipeline cannot cut it into stages";
  for (int64_t layer = first_; layer < end_; ++layer) (*model_)[static_cast<size_t>(layer)]->to(device);
  if (!params_.empty()) gradients_ = std::make_unique<FlatGradients>(params_);
  optimizer_ = make_optimizer(params_);
}

StepResult SequentialPipelineRank::step(const TensorBatch& global_batch, const StepContext& context) {
  StepResult result;
  result.devices.resize(1);
  DeviceTimes& times = result.devices[0];
  StepClock::time_point start = StepClock::now();
  times.started = std::chrono::duration<double>(start.time_since_epoch()).count();
  check_batch_has_samples("SequentialPipelineRank", global_batch);
  const MeshShape& shape = mesh_.shape();
  const int64_t batch = global_batch.size(), micro = options_.micro_batch;
  const std::string layout_error = check_step_layout(batch, micro, shape.dp);
  LOCKSTEP_CHECK(layout_error.empty()) << layout_error;
  const int64_t share = batch / shape.dp, first_row = mesh_.coord().dp * share, micro_batches = share / micro;
  const int stages = shape.pp;
  const bool first_stage = stage() == 0, last_stage = stage() == stages - 1;
  comm::Communicator& pp = *mesh_.pp_group();

  struct InFlight {
    Tensor input, output;            // output: the loss sum on the last stage
    double weight = 0;               // last stage: the loss's divisor, global batch × terms per sample
    std::vector<Tensor> statistics;  // the forward's running statistics
  };
  std::vector<InFlight> in_flight(static_cast<size_t>(micro_batches));
  StageLinks links(pp, times);
  statistics_.discard();
  GradientTree tree;
  for (const PipelineOp& op : pipeline_ops(options_.schedule, stage(), stages, micro_batches)) {
    InFlight& slot = in_flight[static_cast<size_t>(op.micro_batch)];
    comm::FlightRecorder::process().set_micro_batch(op.micro_batch);
    const comm::FlightPhase phase(op.forward ? "forward" : "backward");
    const int64_t row = first_row + op.micro_batch * micro;
    if (op.forward) {
      const TensorBatch micro_batch = global_batch.slice(row, micro);
      if (first_stage) {
        slot.input =
            (options_.make_input ? options_.make_input(micro_batch) : micro_batch.at(options_.input)).to(device_);
      } else {
        const Tensor header = Tensor::empty({kHeaderLength}, DType::i64);
        links.recv(header, stage() - 1, kHeader);
        slot.input = empty_like_header(header, device_);
        links.recv(slot.input, stage() - 1, kActivation);
        if (is_floating(slot.input.dtype())) slot.input.set_requires_grad(true);
      }
      const StepClock::time_point compute = StepClock::now();
      const StepContext micro_context{
          .seed = context.seed, .step = context.step, .first_sample = context.first_sample + row};
      model_->set_forward_context(micro_context);  // numbers random layers over the whole model, as one device does
      Tensor x = slot.input;
      for (int64_t layer = first_; layer < end_; ++layer) x = (*(*model_)[static_cast<size_t>(layer)])(x);
      if (last_stage) {
        const Tensor losses = options_.loss(x, micro_batch.to(device_), micro_context);
        slot.weight = static_cast<double>(batch * check_per_sample_loss(losses, micro));
        slot.output = sum(losses);
      } else {
        slot.output = x;
      }
      slot.statistics = statistics_.take();
      times.compute += seconds_since(compute);
      if (!last_stage) {
        links.send(header_of(x), stage() + 1, kHeader);
        links.send(x.detach(), stage() + 1, kActivation);
      }
      continue;
    }
    Tensor gradient;
    if (last_stage) {
      gradient = Tensor::scalar(1.0 / slot.weight, slot.output.dtype(), device_);
    } else {
      gradient = Tensor::empty(slot.output.shape(), slot.output.dtype(), device_);
      links.recv(gradient, stage() + 1, kGradient);
    }
    const StepClock::time_point compute = StepClock::now();
    std::optional<GradientCollector> collected;
    if (gradients_) collected.emplace(*gradients_);
    if (slot.output.requires_grad()) slot.output.backward(gradient);
    if (!first_stage) {
      const Tensor input_grad = slot.input.requires_grad() ? slot.input.grad() : Tensor();
      links.send(input_grad.defined() ? input_grad : Tensor::zeros(slot.input.shape(), slot.input.dtype(), device_),
                 stage() - 1, kGradient);
    }
    // This stage's part of the micro-batch's leaf: its layers' gradients, their running
    // statistics, and on the last stage the loss.
    std::vector<Tensor> leaf;
    if (collected) leaf.push_back(collected->finish());
    for (Tensor& entry : slot.statistics) leaf.push_back(std::move(entry));
    if (last_stage) {
      leaf.push_back(div(reshape(slot.output.detach(), {1}).to(DType::f64),
                         Tensor::full({1}, slot.weight, DType::f64, slot.output.device())));
    }
    tree.add_leaf(std::move(leaf));
    slot = InFlight{};  // this micro-batch's activations go now
    times.compute += seconds_since(compute);
  }
  std::vector<Tensor> sums = tree.finish();
  links.finish();

  // The top of the tree: the replicas' subtrees, in tree order.
  comm::Communicator& dp = *mesh_.dp_group();
  start = StepClock::now();
  dp.barrier();  // so the wait for the slowest replica is not counted as communication
  times.wait = seconds_since(start);
  start = StepClock::now();
  for (const Tensor& sum_of_leaves : sums) dp.all_reduce(sum_of_leaves);
  const Tensor loss = last_stage ? sums.back() : Tensor::zeros({1}, DType::f64);
  pp.broadcast(loss, stages - 1);
  result.loss = loss.to(Device::cpu()).data<double>()[0];
  times.communicate += seconds_since(start);

  start = StepClock::now();
  const size_t statistics_begin = gradients_ ? 1 : 0;
  const size_t statistics_end = sums.size() - (last_stage ? 1 : 0);
  if (statistics_end > statistics_begin) {
    statistics_.apply(std::vector<Tensor>(sums.begin() + static_cast<std::ptrdiff_t>(statistics_begin),
                                          sums.begin() + static_cast<std::ptrdiff_t>(statistics_end)));
  }
  if (gradients_) gradients_->give(sums[0]);
  {
    const comm::FlightPhase phase("optimizer");
    optimizer_->step();  // without parameters too, so that every stage counts the steps
  }
  optimizer_->zero_grad();
  times.optimizer = seconds_since(start);
  return result;
}

void SequentialPipelineRank::gather_full() {
  comm::Communicator& world = *mesh_.world();
  int64_t layer_end = 0;
  NoGradGuard no_grad;
  for (int s = 0; s < mesh_.shape().pp; ++s) {
    const int64_t layer_begin = layer_end;
    layer_end += sizes_[static_cast<size_t>(s)];
    const int root = mesh_rank(mesh_.shape(), MeshCoord{.dp = 0, .tp = 0, .pp = s});
    for (int64_t layer = layer_begin; layer < layer_end; ++layer) {
      for (const auto& [name, tensor] : (*model_)[static_cast<size_t>(layer)]->state_dict())
        world.broadcast(tensor, root);
    }
  }
}

NamedTensors SequentialPipelineRank::gather_full_optimizer_state() {
  comm::Communicator& world = *mesh_.world();
  const std::vector<optim::StateSlot>& slots = optimizer_->slots();
  NamedTensors full;
  for (int s = 0; s < mesh_.shape().pp; ++s) {
    const int root = mesh_rank(mesh_.shape(), MeshCoord{.dp = 0, .tp = 0, .pp = s});
    const bool mine = world.rank() == root;
    // The root's entries, each as [full parameter index (-1: "step"), slot, then the header].
    std::vector<std::pair<std::vector<int64_t>, Tensor>> entries;
    if (mine) {
      for (const auto& [key, tensor] : optimizer_->state_dict()) {
        size_t index = 0;
        std::string slot;
        const bool per_parameter = optim::parse_state_key(key, index, slot);
        if (!per_parameter && (key != "step" || s != 0)) continue;  // the step count: stage 0's
        size_t slot_number = 0;
        while (per_parameter && slot_number < slots.size() && slots[slot_number].name != slot) ++slot_number;
        const Tensor header = header_of(tensor);
        std::vector<int64_t> description{per_parameter ? static_cast<int64_t>(full_index_[index]) : -1,
                                         static_cast<int64_t>(slot_number)};
        for (const int64_t v : header.to_vector<int64_t>()) description.push_back(v);
        entries.emplace_back(description, tensor.to(Device::cpu()).contiguous());
      }
    }
    const Tensor count = Tensor::full({1}, static_cast<double>(entries.size()), DType::i64);
    world.broadcast(count, root);
    for (int64_t e = 0; e < count.to_vector<int64_t>()[0]; ++e) {
      const Tensor description = mine ? Tensor::from_vector(entries[static_cast<size_t>(e)].first, {kHeaderLength + 2})
                                      : Tensor::empty({kHeaderLength + 2}, DType::i64);
      world.broadcast(description, root);
      const std::vector<int64_t> d = description.to_vector<int64_t>();
      const Tensor value = mine ? entries[static_cast<size_t>(e)].second
                                : empty_like_header(slice(description, 0, 2, 2 + kHeaderLength), Device::cpu());
      world.broadcast(value, root);
      full.emplace_back(
          d[0] < 0 ? "step" : optim::state_key(static_cast<size_t>(d[0]), slots[static_cast<size_t>(d[1])].name),
          value);
    }
  }
  // Stage by stage, each in its own order: "step", then by parameter, as an unsharded
  // optimizer orders them.
  return full;
}

void SequentialPipelineRank::load_full_optimizer_state(const NamedTensors& optimizer_state) {
  std::vector<size_t> local_of(model_->parameters().size(), SIZE_MAX);
  for (size_t j = 0; j < full_index_.size(); ++j) local_of[full_index_[j]] = j;
  NamedTensors local;
  for (const auto& [key, tensor] : optimizer_state) {
    size_t index = 0;
    std::string slot;
    if (!optim::parse_state_key(key, index, slot)) {
      local.emplace_back(key, tensor);
      continue;
    }
    LOCKSTEP_CHECK(index < local_of.size())
        << "optimizer state " << key << " names parameter " << index << ", but the model has " << local_of.size();
    if (local_of[index] != SIZE_MAX) local.emplace_back(optim::state_key(local_of[index], slot), tensor);
  }
  optimizer_->load_state_dict(local);
}

}  // namespace lockstep::parallel
