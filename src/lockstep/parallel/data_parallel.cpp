#include "lockstep/parallel/data_parallel.h"

#include <algorithm>
#include <chrono>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/comm/flight_recorder.h"
#include "lockstep/comm/local_communicator.h"
#include "lockstep/comm/slices.h"
#include "lockstep/comm/tree_reduce.h"
#include "lockstep/core/storage.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/gpu_share_exchange.h"
#include "lockstep/parallel/gradient_tree.h"

namespace lockstep::parallel {
namespace {

// Each parameter's gradient, taken out of .grad as it is (zeros for a parameter that got
// none): the leaf of the step's tree, with no copy into a flat buffer (5% of the MLP's step
// on one thread).
std::vector<Tensor> take_grads(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  grads.reserve(params.size() + 1);
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    grads.push_back(g.defined() ? g.contiguous() : Tensor::zeros(p.shape(), p.dtype(), p.device()));
    p.set_grad(Tensor());
  }
  return grads;
}

// Device d's share of a parameter of n elements: cut as the collectives cut their slices
// (comm/slices.h). Device 0's is never empty.
using Share = comm::Slice;
Share share_of(int64_t n, int device, int devices, DType dtype) {
  return comm::slice_of(n, device, devices, dtype_size(dtype));
}

// A tensor on `device` over the bytes of `weights`, which it keeps alive. The device's
// allocator never sees them: memory_stats counts shared weights once, on their own device.
Tensor alias_on(const Tensor& weights, Device device) {
  LOCKSTEP_CHECK(weights.is_contiguous()) << "a parameter " << shape_str(weights.shape())
                                          << " is not contiguous; register contiguous tensors as parameters";
  auto storage =
      std::make_shared<Storage>(device, weights.nbytes(), weights.raw_data(), [keep = weights.storage()](void*) {});
  return Tensor::from_storage(std::move(storage), weights.shape(), weights.dtype());
}

// Every replica must be the same model: its parameters' shapes and dtypes are device 0's.
void check_same_model(const std::vector<Tensor>& weights, const std::vector<Tensor>& params, Device device) {
  LOCKSTEP_CHECK(params.size() == weights.size())
      << "make_replica gave " << device << " a model with " << params.size() << " parameters, but " << weights.size()
      << " to device 0: every device needs the same model";
  for (size_t i = 0; i < params.size(); ++i) {
    LOCKSTEP_CHECK(params[i].shape() == weights[i].shape() && params[i].dtype() == weights[i].dtype())
        << "make_replica gave " << device << " parameter " << i << " as " << shape_str(params[i].shape()) << " "
        << dtype_name(params[i].dtype()) << ", but device 0 " << shape_str(weights[i].shape()) << " "
        << dtype_name(weights[i].dtype()) << ": every device needs the same model";
  }
}

// Points `params` at the bytes of `weights` (replica 0's), where they stay on `device`.
void share_weights(const std::vector<Tensor>& weights, const std::vector<Tensor>& params, Device device) {
  for (size_t i = 0; i < params.size(); ++i) params[i].set_data(alias_on(weights[i], device));
}

// Whether every device's gradients are finite, from each device's own answer for its
// shares: every device takes the same decision (to step or to skip, and how the loss scale
// changes) before any of them steps.
bool finite_on_every_device(comm::Communicator& comm, bool finite_here) {
  const Tensor overflowed = Tensor::full({1}, finite_here ? 0.0 : 1.0, DType::f32);
  comm.all_reduce(overflowed, comm::ReduceOp::max);
  return overflowed.item() == 0.0;
}

// An optimizer's entries that are not per-parameter state ("step").
NamedTensors counters_of(const optim::Optimizer& optimizer) {
  NamedTensors counters;
  for (const auto& [key, tensor] : optimizer.state_dict()) {
    size_t index = 0;
    std::string slot;
    if (!optim::parse_state_key(key, index, slot)) counters.emplace_back(key, tensor);
  }
  return counters;
}

}  // namespace

DataParallel::DataParallel(const DataParallelOptions& options, const MakeReplica& make_replica,
                           const OptimizerFactory& make_optimizer)
    : options_(options), shared_weights_(options.device_type == DeviceType::cpu), make_optimizer_(make_optimizer) {
  LOCKSTEP_CHECK(options.devices >= 1) << "data parallel needs at least one device, got " << options.devices;
  LOCKSTEP_CHECK(options.micro_batch >= 1)
      << "the micro-batch must hold at least one sample, got " << options.micro_batch;
  check_loss_function("DataParallel", options.loss);
  check_precision(options.precision, Device(options.device_type, 0));
  comms_ = comm::LocalCommunicator::create_group(options.devices);
  const auto devices = static_cast<size_t>(options.devices);
  for (int d = 0; d < options.devices; ++d) {
    replicas_.push_back(make_replica(d));
    // Each replica lives on its own device, so memory_stats(cpu:d) is device d's memory.
    const Device device = this->device(d);
    replicas_.back()->to(device);
    statistics_.emplace_back(*replicas_.back());
    params_.push_back(replicas_.back()->parameters());
    if (d > 0) check_same_model(params_[0], params_.back(), device);
    if (shared_weights_ && d > 0) share_weights(params_[0], params_.back(), device);
    // Each device's optimizer steps its share of every parameter, through 1-D views of its
    // replica's weights (on CPU devices, of the one copy they share).
    std::vector<size_t>& owned = owned_.emplace_back();
    std::vector<Tensor>& views = share_views_.emplace_back();
    NoGradGuard no_grad;  // the views are leaves of their own, not steps of the model's graph
    for (size_t i = 0; i < params_.back().size(); ++i) {
      const Tensor& p = params_.back()[i];
      const Share share = share_of(p.numel(), d, options.devices, p.dtype());
      if (share.size == 0) continue;
      owned.push_back(i);
      Tensor view = slice(p.reshape({p.numel()}), 0, share.begin, share.begin + share.size);
      view.set_requires_grad(true);
      views.push_back(view);
    }
    optimizers_.push_back(make_optimizer(views));
  }
  sums_.resize(devices);
  if (options.precision == DType::f16) scalers_.resize(devices);
  if (!shared_weights_) exchange_ = std::make_unique<GpuShareExchange>(options.devices);
  // Offload's overlapped update, where only the replicas' forwards read the weights after a
  // step: on CPU devices (one copy, every device's shares in it) or one GPU. Several GPUs
  // copy each other's updated shares within the step (gather_shares), so they step inside it.
  if (shared_weights_ || options.devices == 1) {
    std::vector<nn::Module*> replicas;
    std::vector<optim::Optimizer*> optimizers;
    for (const auto& replica : replicas_) replicas.push_back(replica.get());
    for (const auto& optimizer : optimizers_) optimizers.push_back(optimizer.get());
    read_guard_ = std::make_unique<optim::ParameterReadGuard>(replicas, optimizers);
  }
  workers_ = std::make_unique<DeviceWorkers>(
      options.devices, options.threads_per_device, [this](int device, const std::string& message) {
        // The other devices stop waiting for this one.
        comms_[device]->abort("device " + std::to_string(device) + ": " + message);
      });
}

DataParallel::~DataParallel() = default;

void DataParallel::set_lr(double lr) {
  for (const auto& optimizer : optimizers_) optimizer->set_lr(lr);
}

double DataParallel::lr() const { return optimizers_[0]->lr(); }

void DataParallel::load_model_state(const NamedTensors& state) {
  // Shared CPU weights take the same values once per replica; buffers are each replica's own.
  for (const auto& replica : replicas_) replica->load_state_dict(state);
}

std::vector<Device> DataParallel::local_devices() const {
  std::vector<Device> out;
  for (int d = 0; d < devices(); ++d) out.push_back(device(d));
  return out;
}

int DataParallel::local_index(int device, size_t param) const {
  const std::vector<size_t>& owned = owned_[static_cast<size_t>(device)];
  const auto it = std::lower_bound(owned.begin(), owned.end(), param);
  return it != owned.end() && *it == param ? static_cast<int>(it - owned.begin()) : -1;
}

NamedTensors DataParallel::optimizer_state() {
  // "step", then per parameter its slots, as the unsharded optimizer orders them: a
  // per-element slot put together from the devices' shares, a count from device 0's.
  NamedTensors state;
  for (const auto& [key, tensor] : counters_of(*optimizers_[0])) state.emplace_back(key, tensor.clone());
  const std::vector<optim::StateSlot>& slots = optimizers_[0]->slots();
  for (size_t i = 0; i < params_[0].size(); ++i) {
    const Tensor& param = params_[0][i];
    const int first = local_index(0, i);
    if (first < 0) continue;  // an empty parameter: no state
    for (size_t s = 0; s < slots.size(); ++s) {
      const Tensor& device0 = optimizers_[0]->state(static_cast<size_t>(first), s);
      if (!device0.defined()) continue;
      if (!slots[s].per_element) {
        state.emplace_back(optim::state_key(i, slots[s].name), device0.clone());
        continue;
      }
      Tensor whole = Tensor::empty(param.shape(), device0.dtype(), device(0));
      const Tensor flat = whole.reshape({whole.numel()});
      for (int d = 0; d < devices(); ++d) {
        const int j = local_index(d, i);
        if (j < 0) continue;
        const Share share = share_of(param.numel(), d, devices(), param.dtype());
        slice(flat, 0, share.begin, share.begin + share.size)
            .copy_from(optimizers_[static_cast<size_t>(d)]->state(static_cast<size_t>(j), s));
      }
      state.emplace_back(optim::state_key(i, slots[s].name), whole);
    }
  }
  if (!scalers_.empty()) {  // every device's scaler is alike
    for (auto& entry : scalers_[0].state_dict()) state.push_back(std::move(entry));
  }
  return state;
}

void DataParallel::load_optimizer_state(const NamedTensors& state) {
  NamedTensors optimizer_state = state;
  const NamedTensors scaler_state = optim::extract_scaler_state(optimizer_state);
  // A checkpoint of an f32 or bf16 run has no scaler state: f16 then starts from the default scale.
  if (!scaler_state.empty()) {
    for (auto& scaler : scalers_) scaler.load_state_dict(scaler_state);
  }
  // Loaded first into an unsharded optimizer, which checks it and names any problem by the
  // checkpoint's own keys; then each device takes its shares.
  const std::unique_ptr<optim::Optimizer> whole = make_optimizer_(params_[0]);
  whole->load_state_dict(optimizer_state);
  const std::vector<optim::StateSlot>& slots = whole->slots();
  const NamedTensors counters = counters_of(*whole);
  for (int d = 0; d < devices(); ++d) {
    NamedTensors shares = counters;
    const std::vector<size_t>& owned = owned_[static_cast<size_t>(d)];
    for (size_t j = 0; j < owned.size(); ++j) {
      for (size_t s = 0; s < slots.size(); ++s) {
        const Tensor& value = whole->state(owned[j], s);
        if (!value.defined()) continue;
        const Share share = share_of(value.numel(), d, devices(), value.dtype());
        shares.emplace_back(optim::state_key(j, slots[s].name),
                            slots[s].per_element
                                ? slice(value.reshape({value.numel()}), 0, share.begin, share.begin + share.size)
                                : value);
      }
    }
    optimizers_[static_cast<size_t>(d)]->load_state_dict(shares);  // copies
  }
}

int64_t DataParallel::optimizer_state_bytes(int device) const {
  return optimizers_.at(static_cast<size_t>(device))->state_bytes();
}

void DataParallel::run_device(int device, const TensorBatch& batch, const StepContext& context, StepResult& result,
                              bool& updating) {
  DeviceTimes& times = result.devices[static_cast<size_t>(device)];
  StepClock::time_point start = StepClock::now();
  times.started = std::chrono::duration<double>(start.time_since_epoch()).count();
  nn::Module& model = *replicas_[device];
  const std::vector<Tensor>& params = params_[static_cast<size_t>(device)];
  const int64_t samples = batch.size();
  const int64_t micro = options_.micro_batch;
  const int64_t per_device = samples / devices();
  StepStatistics& statistics = statistics_[static_cast<size_t>(device)];
  statistics.discard();
  GradientTree tree;
  for (int64_t first = device * per_device; first < (device + 1) * per_device; first += micro) {
    const Precision precision{options_.precision, scalers_.empty() ? 1.0 : scalers_[device].scale()};
    const Tensor loss =
        run_micro_batch(model, options_.loss, batch, first, micro, samples, context, this->device(device), precision);
    // Running statistics and the loss ride along as the leaf's last entries, so they are
    // summed in the same order.
    std::vector<Tensor> leaf = take_grads(params);
    for (Tensor& entry : statistics.take()) leaf.push_back(std::move(entry));
    leaf.push_back(loss);
    tree.add_leaf(std::move(leaf));
  }
  // The parameters' sums, then the running statistics', then the loss's: every device reads
  // its share of the first from every device's, and on GPUs the whole of the others.
  std::vector<Tensor>& sums = sums_[static_cast<size_t>(device)];
  sums = tree.finish();  // published by the barrier
  if (exchange_) exchange_->sums_queued(device);
  times.compute = seconds_since(start);

  comm::Communicator& comm = *comms_[device];
  start = StepClock::now();
  comm.barrier();  // so the wait for the slowest device is not counted as communication
  updating = true;
  times.wait = seconds_since(start);
  start = StepClock::now();
  if (exchange_) exchange_->wait_for_sums(device);
  const Tensor loss_sum = sum_over_devices(device, sums.size() - 1);
  std::vector<Tensor> statistic_sums;
  for (size_t i = params.size(); i + 1 < sums.size(); ++i) statistic_sums.push_back(sum_over_devices(device, i));
  if (!statistic_sums.empty()) statistics.apply(statistic_sums);
  times.communicate = seconds_since(start);
  step_share(device, result, times);
  if (exchange_) gather_shares(device, times);
  // Last: on a GPU the host waits here until device 0 has run its whole step.
  if (device == 0) result.loss = loss_sum.item();
}

Tensor DataParallel::sum_over_devices(int device, size_t index) {
  const Tensor& own = sums_[static_cast<size_t>(device)][index];
  if (!exchange_) {
    comms_[device]->all_reduce(own);
    return own;
  }
  if (devices() == 1) return own;
  // Into a tensor of its own: the other devices still read this device's sum.
  const Tensor total = Tensor::empty(own.shape(), own.dtype(), own.device());
  exchange_->fold(device, sums_, index, 0, total);
  return total;
}

void DataParallel::fold_share(int device, size_t param, int64_t begin, const Tensor& out) {
  if (exchange_) return exchange_->fold(device, sums_, param, begin, out);
  const DType dtype = out.dtype();
  const size_t offset = static_cast<size_t>(begin) * dtype_size(dtype);
  std::vector<const void*> inputs(static_cast<size_t>(devices()));
  for (size_t e = 0; e < inputs.size(); ++e) inputs[e] = static_cast<const char*>(sums_[e][param].raw_data()) + offset;
  comm::tree_reduce(inputs.data(), devices(), out.raw_data(), out.numel(), dtype, comm::ReduceOp::sum);
}

void DataParallel::step_share(int device, StepResult& result, DeviceTimes& times) {
  StepClock::time_point start = StepClock::now();
  const std::vector<size_t>& owned = owned_[static_cast<size_t>(device)];
  const std::vector<Tensor>& views = share_views_[static_cast<size_t>(device)];
  {
    NoGradGuard no_grad;
    for (size_t j = 0; j < owned.size(); ++j) {
      // The all-reduce's fold, in its order, of this device's share only, into its own sums:
      // the other devices read only their own shares of them.
      const Tensor& sum = sums_[static_cast<size_t>(device)][owned[j]];
      const Share share = share_of(sum.numel(), device, devices(), sum.dtype());
      const Tensor summed_share = slice(sum.reshape({sum.numel()}), 0, share.begin, share.begin + share.size);
      if (devices() > 1) fold_share(device, owned[j], share.begin, summed_share);  // one device's sum is the whole
      views[j].set_grad(summed_share);
    }
  }
  times.communicate += seconds_since(start);
  start = StepClock::now();
  bool finite = true;
  if (!scalers_.empty()) {
    // Each device checks its shares only: the devices agree before any of them steps.
    std::vector<Tensor> grads;
    for (const Tensor& view : views) grads.push_back(view.grad());
    finite = finite_on_every_device(*comms_[device], scalers_[device].unscale(grads));
    scalers_[device].update(finite);
    if (device == 0) result.skipped = !finite;
  }
  {
    const comm::FlightPhase phase("optimizer");
    if (finite) optimizers_[static_cast<size_t>(device)]->step();
  }
  optimizers_[static_cast<size_t>(device)]->zero_grad();
  times.optimizer = seconds_since(start);
}

void DataParallel::gather_shares(int device, DeviceTimes& times) {
  if (devices() == 1) return;
  const StepClock::time_point start = StepClock::now();
  exchange_->updates_queued(device);
  comms_[device]->barrier();
  exchange_->wait_for_updates(device);
  const std::vector<Tensor>& mine = params_[static_cast<size_t>(device)];
  for (int other = 0; other < devices(); ++other) {
    if (other == device) continue;
    const std::vector<Tensor>& theirs = params_[static_cast<size_t>(other)];
    for (const size_t i : owned_[static_cast<size_t>(other)]) {
      const Share share = share_of(theirs[i].numel(), other, devices(), theirs[i].dtype());
      exchange_->copy_elements(theirs[i], mine[i], share.begin, share.size);
    }
  }
  times.communicate += seconds_since(start);
}

StepResult DataParallel::step(const TensorBatch& batch, const StepContext& context) {
  check_batch_has_samples("DataParallel", batch);
  const std::string layout_error = check_step_layout(batch.size(), options_.micro_batch, devices());
  LOCKSTEP_CHECK(layout_error.empty()) << layout_error;
  StepResult result;
  result.devices.resize(static_cast<size_t>(devices()));
  // Every device has folded its shares once the run is over (on GPUs, every device's stream
  // waits for the others' folds before the run ends): the sums go, error or not.
  struct ReleaseSums {
    std::vector<std::vector<Tensor>>& sums;
    ~ReleaseSums() {
      for (auto& device_sums : sums) device_sums.clear();
    }
  } release{sums_};
  try {
    workers_->run([&](int device) {
      bool updating = false;
      try {
        run_device(device, batch, context, result, updating);
      } catch (const OutOfMemoryError& e) {
        if (!updating) throw;
        // Some devices may have stepped their shares: the step cannot be taken again.
        LOCKSTEP_FAIL() << e.what() << " (while the gradients were summed and the weights updated, so the "
                        << "weights may be partly updated: continue from the last checkpoint)";
      }
    });
  } catch (const OutOfMemoryError&) {
    if (exchange_) exchange_->drain();
    recover_from_failed_step();
    throw;
  } catch (...) {
    // Another device's stream may still read a device's sums, which go on return.
    if (exchange_) exchange_->drain();
    throw;
  }
  return result;
}

std::string DataParallel::set_micro_batch(int64_t micro_batch, int64_t global_batch) {
  if (micro_batch < 1) return "the micro-batch must hold at least one sample, got " + std::to_string(micro_batch);
  const std::string error = check_step_layout(global_batch, micro_batch, devices());
  if (!error.empty()) return error;
  options_.micro_batch = micro_batch;
  return "";
}

void DataParallel::recover_from_failed_step() {
  for (const std::vector<Tensor>& params : params_) {
    for (const Tensor& p : params) p.set_grad(Tensor());
  }
  comms_ = comm::LocalCommunicator::create_group(devices());
}

}  // namespace lockstep::parallel
