#include "lockstep/parallel/data_parallel.h"

#include <chrono>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/comm/local_communicator.h"
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
// none). Without ZeRO the devices all-reduce these in place, one call per parameter: the
// same bits as one flat buffer (the tree is over devices, element by element) without
// copying every gradient into one each step (5% of the MLP's step on one thread).
std::vector<Tensor> take_grads(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  grads.reserve(params.size() + 1);
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    grads.push_back(g.defined() ? g : Tensor::zeros(p.shape(), p.dtype(), p.device()));
    p.set_grad(Tensor());
  }
  return grads;
}

}  // namespace

DataParallel::DataParallel(const DataParallelOptions& options, const MakeReplica& make_replica,
                           const OptimizerFactory& make_optimizer)
    : options_(options) {
  LOCKSTEP_CHECK(options.devices >= 1) << "data parallel needs at least one device, got " << options.devices;
  LOCKSTEP_CHECK(options.micro_batch >= 1)
      << "the micro-batch must hold at least one sample, got " << options.micro_batch;
  check_precision(options.precision, Device(options.device_type, 0));
  LOCKSTEP_CHECK(!(options.zero1 && options.device_type == DeviceType::cuda))
      << "ZeRO-1 over CUDA devices in one process is not supported yet: use --strategy dp without zero1, or one "
         "process per GPU (lockstep run ... --strategy zero1 --backend nccl)";
  comms_ = comm::LocalCommunicator::create_group(options.devices);
  gradients_.reserve(static_cast<size_t>(options.devices));  // the sharded optimizers keep references
  for (int d = 0; d < options.devices; ++d) {
    replicas_.push_back(make_replica(d));
    // Each replica lives on its own device, so memory_stats(cpu:d) is device d's memory.
    const Device device = this->device(d);
    replicas_.back()->to(device);
    gradients_.emplace_back(replicas_.back()->parameters(), options.zero1 ? options.devices : 1);
    if (options.zero1) {
      sharded_.push_back(std::make_unique<ShardedOptimizer>(gradients_.back(), *comms_[d], make_optimizer));
    } else {
      optimizers_.push_back(make_optimizer(replicas_.back()->parameters()));
    }
  }
  if (options.precision == DType::f16) scalers_.resize(static_cast<size_t>(options.devices));
  workers_ = std::make_unique<DeviceWorkers>(
      options.devices, options.threads_per_device, [this](int device, const std::string& message) {
        // The other devices stop waiting for this one.
        comms_[device]->abort("device " + std::to_string(device) + ": " + message);
      });
}

DataParallel::~DataParallel() = default;

void DataParallel::set_lr(double lr) {
  for (const auto& optimizer : optimizers_) optimizer->set_lr(lr);
  for (const auto& optimizer : sharded_) optimizer->set_lr(lr);
}

double DataParallel::lr() const { return options_.zero1 ? sharded_[0]->lr() : optimizers_[0]->lr(); }

NamedTensors DataParallel::optimizer_state() {
  if (!options_.zero1) {
    NamedTensors state = optimizers_[0]->state_dict();
    if (!scalers_.empty()) {
      for (auto& entry : scalers_[0].state_dict()) state.push_back(std::move(entry));
    }
    return state;
  }
  std::vector<NamedTensors> states(static_cast<size_t>(devices()));
  workers_->run([&](int d) { states[static_cast<size_t>(d)] = sharded_[static_cast<size_t>(d)]->full_state_dict(); });
  return states[0];
}

void DataParallel::load_optimizer_state(const NamedTensors& state) {
  NamedTensors optimizer_state = state;
  const NamedTensors scaler_state = optim::extract_scaler_state(optimizer_state);
  // A checkpoint of an f32 or bf16 run has no scaler state: f16 then starts from the default scale.
  if (!scaler_state.empty()) {
    for (auto& scaler : scalers_) scaler.load_state_dict(scaler_state);
  }
  for (const auto& optimizer : optimizers_) optimizer->load_state_dict(optimizer_state);
  for (const auto& optimizer : sharded_) optimizer->load_full_state_dict(state);
}

int64_t DataParallel::optimizer_state_bytes(int device) const {
  if (options_.zero1) return sharded_.at(static_cast<size_t>(device))->state_bytes();
  return optimizers_.at(static_cast<size_t>(device))->state_bytes();
}

void DataParallel::run_device(int device, const Tensor& images, const Tensor& labels, int64_t first_sample,
                              uint64_t step, uint64_t seed, StepResult& result) {
  DeviceTimes& times = result.devices[static_cast<size_t>(device)];
  StepClock::time_point start = StepClock::now();
  times.started = std::chrono::duration<double>(start.time_since_epoch()).count();
  nn::Module& model = *replicas_[device];
  const FlatGradients& gradients = gradients_[static_cast<size_t>(device)];
  const std::vector<Tensor>& params = gradients.params();
  const int64_t batch = images.size(0);
  const int64_t micro = options_.micro_batch;
  const int64_t per_device = batch / devices();
  GradientTree tree;
  for (int64_t first = device * per_device; first < (device + 1) * per_device; first += micro) {
    const Precision precision{options_.precision, scalers_.empty() ? 1.0 : scalers_[device].scale()};
    const Tensor loss = run_micro_batch(model, images, labels, first, micro, batch, first_sample, step, seed,
                                        this->device(device), precision);
    // The loss rides along as the leaf's last entry, so it is summed in the same order.
    std::vector<Tensor> leaf = options_.zero1 ? std::vector<Tensor>{gradients.take_all()} : take_grads(params);
    leaf.push_back(loss);
    tree.add_leaf(std::move(leaf));
  }
  std::vector<Tensor> sums = tree.finish();
  const Tensor loss_sum = sums.back();
  sums.pop_back();
  times.compute = seconds_since(start);

  comm::Communicator& comm = *comms_[device];
  start = StepClock::now();
  comm.barrier();  // so the wait for the slowest device is not counted as communication
  times.wait = seconds_since(start);
  start = StepClock::now();
  all_reduce_on_host(comm, loss_sum);
  if (device == 0) result.loss = loss_sum.item();
  if (!options_.zero1) {
    for (const Tensor& grad : sums) all_reduce_on_host(comm, grad);
    times.communicate = seconds_since(start);
    start = StepClock::now();
    bool finite = true;
    if (!scalers_.empty()) {  // every device sees the same sum, so all decide alike
      finite = scalers_[device].unscale(sums);
      scalers_[device].update(finite);
      if (device == 0) result.skipped = !finite;
    }
    for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(sums[i]);
    if (finite) optimizers_[device]->step();
    optimizers_[device]->zero_grad();
    times.optimizer = seconds_since(start);
    return;
  }
  // ZeRO-1: each device reduces and steps its shard, then gathers everyone's weights.
  times.communicate = seconds_since(start);
  sharded_[device]->step(sums[0], times);
}

StepResult DataParallel::step(const Tensor& images, const Tensor& labels, int64_t first_sample, uint64_t step,
                              uint64_t seed) {
  const int64_t batch = images.size(0);
  LOCKSTEP_CHECK(labels.size(0) == batch) << "images hold " << batch << " samples but labels " << labels.size(0);
  const std::string layout_error = check_step_layout(batch, options_.micro_batch, devices());
  LOCKSTEP_CHECK(layout_error.empty()) << layout_error;
  StepResult result;
  result.devices.resize(static_cast<size_t>(devices()));
  workers_->run([&](int device) { run_device(device, images, labels, first_sample, step, seed, result); });
  return result;
}

}  // namespace lockstep::parallel
