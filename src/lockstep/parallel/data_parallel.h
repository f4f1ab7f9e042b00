// Single-process data parallelism (the nn.DataParallel / MirroredStrategy way, done right):
// one replica of the model per device, made once, each driven by its own long-lived worker
// thread. Each step the global batch is cut into micro-batches in sample order; each device
// runs a contiguous run of them and folds their gradients as its subtree of the step's
// tree, and the top of the tree is folded across devices in the all-reduce's order.
//
// Each device folds the top of the tree for its share of every parameter only (the slice
// the one-host all-reduce would give it), reading the other devices' sums where they lie,
// and its optimizer steps that share: no device repeats the optimizer, and each holds 1/N
// of the optimizer state (ZeRO stage 1). CPU devices share one copy of the weights (host
// memory is every CPU device's memory), so there is nothing to gather. GPU replicas each
// keep their weights: the folds run on the GPUs (gpu_share_exchange.h), and after the
// update every device copies the other devices' updated shares into its own replica.
// Under f16 each device checks its own shares for an overflow, and the devices agree on
// the answer before any of them steps, so all skip or all step.
//
// For a fixed (seed, global batch, micro-batch) the weights are the same bits on any number
// of devices whose share of micro-batches is a power of two, and with any number of threads
// per device: the optimizers are elementwise, so each element gets the same update wherever
// it is stepped.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/nn/module.h"
#include "lockstep/optim/loss_scaler.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/optim/optimizer_read_guard.h"
#include "lockstep/parallel/device_workers.h"
#include "lockstep/parallel/layout.h"
#include "lockstep/parallel/sharded_optimizer.h"
#include "lockstep/parallel/step.h"
#include "lockstep/parallel/step_statistics.h"

namespace lockstep::parallel {

class GpuShareExchange;

struct DataParallelOptions {
  LossFunction loss = nullptr;  // one loss per sample of a micro-batch (loss_function.h)
  int devices = 1;              // devices 0 .. devices-1 of device_type
  DeviceType device_type = DeviceType::cpu;
  int64_t micro_batch = 1;  // samples per micro-batch: the leaf of the step's tree
  int threads_per_device = 1;
  // GPU devices: the type matrix products read (bf16, f16; core/autocast.h); f16 also scales
  // the loss (optim/loss_scaler.h) and skips steps whose gradients overflow.
  DType precision = DType::f32;
};

class DataParallel final : public Layout {
 public:
  using MakeReplica = std::function<std::shared_ptr<nn::Module>(int device)>;

  // make_replica(d) must give the same model for every d, and on GPUs the same initial
  // weights (e.g. one seed); CPU devices all take replica 0's. make_optimizer(params) builds
  // an elementwise optimizer (SGD, AdamW) over 1-D views of one device's shares of its
  // replica's parameters (or, to load a state, over replica 0's parameters).
  DataParallel(const DataParallelOptions& options, const MakeReplica& make_replica,
               const OptimizerFactory& make_optimizer);
  ~DataParallel() override;

  // One optimizer step on a global batch of B samples whose first has global index
  // context.first_sample. B must be a multiple of micro_batch, and B / micro_batch a
  // multiple of devices() whose quotient is a power of two (check_step_layout); the error
  // says which sizes work.
  StepResult step(const TensorBatch& batch, const StepContext& context) override;

  nn::Module& model() override { return replica(0); }
  // Into every replica: GPU replicas hold their own weights, so loading only replica(0)
  // would leave the others behind.
  void load_model_state(const NamedTensors& state) override;
  std::vector<Device> local_devices() const override;
  int devices() const { return static_cast<int>(replicas_.size()); }
  Device device(int d) const { return Device(options_.device_type, d); }
  int64_t micro_batch() const override { return options_.micro_batch; }
  // Accepted whenever the global batch splits into it. A step that runs out of memory
  // before the gradients are summed leaves nothing changed (layout.h).
  std::string set_micro_batch(int64_t micro_batch, int64_t global_batch) override;
  int threads_per_device() const { return options_.threads_per_device; }
  nn::Module& replica(int device) { return *replicas_.at(device); }
  // The learning rate of every device's optimizer.
  void set_lr(double lr) override;
  double lr() const override;
  // The optimizer state as one unsharded optimizer over a replica's parameters holds it
  // (put together from the devices' shares, on device 0; under f16 with the loss scaler's
  // entries), and its loading, which hands every device its shares. Checkpoints hold it, so
  // they load on any number of devices, CPU or GPU.
  NamedTensors optimizer_state() override;
  void load_optimizer_state(const NamedTensors& state) override;
  // Bytes of optimizer state device d holds (about 1/devices() of the whole).
  int64_t optimizer_state_bytes(int device) const;

 private:
  // Device d's part of a step; device 0 also writes the step's loss. `updating` turns true
  // once every device has its gradients, when the step starts to change state.
  void run_device(int device, const TensorBatch& batch, const StepContext& context, StepResult& result, bool& updating);
  // After a step failed before its update: every device's gradients dropped and a fresh
  // communicator group for the aborted one, so the next step starts clean (each step
  // discards the statistics a failed one left).
  void recover_from_failed_step();
  // Entry `index` of the devices' sums (the loss's, a running statistic's) summed over every
  // device in the tree's order: on CPU devices all-reduced in place by the `local`
  // communicator (every device calls it), on GPUs folded by each device into a tensor of
  // its own.
  Tensor sum_over_devices(int device, size_t index);
  // Elements [begin, begin + out.numel()) of parameter `param`'s sum over every device, in
  // the tree's order, into out (those elements of device d's own sum).
  void fold_share(int device, size_t param, int64_t begin, const Tensor& out);
  // Folds device d's share of every device's sums and steps it (under f16 once every
  // device has said whether its shares are finite).
  void step_share(int device, StepResult& result, DeviceTimes& times);
  // GPU replicas: once every device has stepped its shares, copies the other devices'
  // updated shares into device d's replica.
  void gather_shares(int device, DeviceTimes& times);
  // The position of parameter `param` among device d's optimizer's parameters, or -1 when
  // its share of it is empty.
  int local_index(int device, size_t param) const;

  DataParallelOptions options_;
  bool shared_weights_;  // CPU devices
  OptimizerFactory make_optimizer_;
  std::vector<std::shared_ptr<nn::Module>> replicas_;
  std::vector<std::vector<Tensor>> params_;  // per device: its replica's parameters
  // Per device: the parameters whose share is not empty, in order, and 1-D views of those
  // shares (its optimizer's parameters).
  std::vector<std::vector<size_t>> owned_;
  std::vector<std::vector<Tensor>> share_views_;
  // Per device, during a step: the sums of its subtree (the parameters', the running
  // statistics', the loss's), which every device reads.
  std::vector<std::vector<Tensor>> sums_;
  std::vector<StepStatistics> statistics_;  // per device: its replica's running statistics
  std::vector<std::unique_ptr<optim::Optimizer>> optimizers_;
  std::vector<optim::LossScaler> scalers_;  // f16: one per device, all alike
  std::vector<std::shared_ptr<comm::Communicator>> comms_;
  std::unique_ptr<GpuShareExchange> exchange_;  // GPU devices
  std::unique_ptr<DeviceWorkers> workers_;
  // Offload's overlapped update: every replica's forward waits for the devices' optimizers
  // (destroyed first, so it waits before they and the replicas go).
  std::unique_ptr<optim::ParameterReadGuard> read_guard_;
};

}  // namespace lockstep::parallel
