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
#include "lockstep/parallel/gradient_tree.h"

namespace lockstep::parallel {
namespace {

// The `local` communicator folds host memory: a GPU device's subtree sum goes through a
// host copy, is folded in the same tree order, and comes back (two copies of the gradient
// per step over PCIe; the fold itself is the CPU devices' one, so the bits are too).
void all_reduce_on_host(comm::Communicator& comm, const Tensor& tensor) {
  if (tensor.device().is_cpu()) return comm.all_reduce(tensor);
  const Tensor host = tensor.to(Device::cpu());
  comm.all_reduce(host);
  tensor.copy_from(host);
}

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

// Points `params` at the bytes of `weights` (replica 0's), where they stay on `device`.
void share_weights(const std::vector<Tensor>& weights, const std::vector<Tensor>& params, Device device) {
  LOCKSTEP_CHECK(params.size() == weights.size())
      << "make_replica gave " << device << " a model with " << params.size() << " parameters, but " << weights.size()
      << " to device 0: every device needs the same model";
  for (size_t i = 0; i < params.size(); ++i) {
    LOCKSTEP_CHECK(params[i].shape() == weights[i].shape() && params[i].dtype() == weights[i].dtype())
        << "make_replica gave " << device << " parameter " << i << " as " << shape_str(params[i].shape()) << " "
        << dtype_name(params[i].dtype()) << ", but device 0 " << shape_str(weights[i].shape()) << " "
        << dtype_name(weights[i].dtype()) << ": every device needs the same model";
    params[i].set_data(alias_on(weights[i], device));
  }
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
    if (!shared_weights_) {
      optimizers_.push_back(make_optimizer(params_.back()));
      continue;
    }
    if (d > 0) share_weights(params_[0], params_.back(), device);
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
  if (!shared_weights_) {
    NamedTensors state = optimizers_[0]->state_dict();
    if (!scalers_.empty()) {
      for (auto& entry : scalers_[0].state_dict()) state.push_back(std::move(entry));
    }
    return state;
  }
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
  return state;
}

void DataParallel::load_optimizer_state(const NamedTensors& state) {
  NamedTensors optimizer_state = state;
  const NamedTensors scaler_state = optim::extract_scaler_state(optimizer_state);
  // A checkpoint of an f32 or bf16 run has no scaler state: f16 then starts from the default scale.
  if (!scaler_state.empty()) {
    for (auto& scaler : scalers_) scaler.load_state_dict(scaler_state);
  }
  if (!shared_weights_) {
    for (const auto& optimizer : optimizers_) optimizer->load_state_dict(optimizer_state);
    return;
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
  std::vector<Tensor> sums = tree.finish();
  const Tensor loss_sum = sums.back();
  sums.pop_back();
  const std::vector<Tensor> statistic_sums(sums.begin() + static_cast<std::ptrdiff_t>(params.size()), sums.end());
  sums.resize(params.size());
  if (shared_weights_) sums_[static_cast<size_t>(device)] = std::move(sums);  // published by the barrier
  times.compute = seconds_since(start);

  comm::Communicator& comm = *comms_[device];
  start = StepClock::now();
  comm.barrier();  // so the wait for the slowest device is not counted as communication
  updating = true;
  times.wait = seconds_since(start);
  start = StepClock::now();
  all_reduce_on_host(comm, loss_sum);
  if (device == 0) result.loss = loss_sum.item();
  for (const Tensor& sum : statistic_sums) all_reduce_on_host(comm, sum);
  if (!statistic_sums.empty()) statistics.apply(statistic_sums);
  times.communicate = seconds_since(start);
  if (shared_weights_) return step_share(device, times);
  start = StepClock::now();
  for (const Tensor& grad : sums) all_reduce_on_host(comm, grad);
  times.communicate += seconds_since(start);
  start = StepClock::now();
  bool finite = true;
  if (!scalers_.empty()) {  // every device sees the same sum, so all decide alike
    finite = scalers_[device].unscale(sums);
    scalers_[device].update(finite);
    if (device == 0) result.skipped = !finite;
  }
  for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(sums[i]);
  {
    const comm::FlightPhase phase("optimizer");
    if (finite) optimizers_[device]->step();
  }
  optimizers_[device]->zero_grad();
  times.optimizer = seconds_since(start);
}

void DataParallel::step_share(int device, DeviceTimes& times) {
  StepClock::time_point start = StepClock::now();
  const std::vector<size_t>& owned = owned_[static_cast<size_t>(device)];
  const std::vector<Tensor>& views = share_views_[static_cast<size_t>(device)];
  std::vector<const void*> inputs(static_cast<size_t>(devices()));
  {
    NoGradGuard no_grad;
    for (size_t j = 0; j < owned.size(); ++j) {
      // The all-reduce's fold, in its order, of this device's share only, into its own sums:
      // the other devices read only their own shares of them.
      const Tensor& sum = sums_[static_cast<size_t>(device)][owned[j]];
      const Share share = share_of(sum.numel(), device, devices(), sum.dtype());
      if (devices() > 1) {  // one device's sum is already the whole
        const size_t offset = static_cast<size_t>(share.begin) * dtype_size(sum.dtype());
        for (size_t e = 0; e < inputs.size(); ++e)
          inputs[e] = static_cast<const char*>(sums_[e][owned[j]].raw_data()) + offset;
        comm::tree_reduce(inputs.data(), devices(), static_cast<char*>(sum.raw_data()) + offset, share.size,
                          sum.dtype(), comm::ReduceOp::sum);
      }
      views[j].set_grad(slice(sum.reshape({sum.numel()}), 0, share.begin, share.begin + share.size));
    }
  }
  times.communicate += seconds_since(start);
  start = StepClock::now();
  {
    const comm::FlightPhase phase("optimizer");
    optimizers_[static_cast<size_t>(device)]->step();
  }
  optimizers_[static_cast<size_t>(device)]->zero_grad();
  times.optimizer = seconds_since(start);
}

StepResult DataParallel::step(const TensorBatch& batch, const StepContext& context) {
  check_batch_has_samples("DataParallel", batch);
  const std::string layout_error = check_step_layout(batch.size(), options_.micro_batch, devices());
  LOCKSTEP_CHECK(layout_error.empty()) << layout_error;
  StepResult result;
  result.devices.resize(static_cast<size_t>(devices()));
  // Every device has folded its shares once the run is over: the sums go, error or not.
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
    recover_from_failed_step();
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
