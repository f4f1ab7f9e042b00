// Single-process data parallelism (the nn.DataParallel / MirroredStrategy way, done right):
// one replica of the model per device, made once, each driven by its own long-lived worker
// thread. Each step the global batch is cut into micro-batches in sample order; each device
// runs a contiguous run of them and folds their gradients as its subtree of the step's
// tree, the `local` communicator folds the top of the tree across devices in one flat
// all-reduce, and every replica takes the same optimizer step. For a fixed (seed, global
// batch, micro-batch) the weights are the same bits on any number of devices whose share
// of micro-batches is a power of two, and with any number of threads per device.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/nn/module.h"
#include "lockstep/optim/loss_scaler.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/device_workers.h"
#include "lockstep/parallel/flat_gradients.h"
#include "lockstep/parallel/sharded_optimizer.h"
#include "lockstep/parallel/step.h"

namespace lockstep::parallel {

struct DataParallelOptions {
  int devices = 1;  // devices 0 .. devices-1 of device_type
  DeviceType device_type = DeviceType::cpu;
  int64_t micro_batch = 1;  // samples per micro-batch: the leaf of the step's tree
  int threads_per_device = 1;
  bool zero1 = false;  // shard the optimizer state across the devices (ZeRO stage 1)
  // GPU devices: the type matrix products read (bf16, f16; core/autocast.h); f16 also scales
  // the loss (optim/loss_scaler.h) and skips steps whose gradients overflow.
  DType precision = DType::f32;
};

class DataParallel {
 public:
  using MakeReplica = std::function<std::shared_ptr<nn::Module>(int device)>;

  // make_replica(d) must give the same initial weights for every d (e.g. one seed). The
  // parameters must share one dtype (the gradients travel as one flat buffer).
  // make_optimizer(params) builds an elementwise optimizer (SGD, AdamW): over a replica's
  // parameters, or under zero1 over one flat shard of them.
  DataParallel(const DataParallelOptions& options, const MakeReplica& make_replica,
               const OptimizerFactory& make_optimizer);
  ~DataParallel();

  // One optimizer step on a global batch (images [B, ...], labels [B]) whose first sample
  // has global index first_sample (dropout masks are keyed by it). B must be a multiple of
  // micro_batch, and B / micro_batch a multiple of devices() whose quotient is a power of
  // two (check_step_layout); the error says which sizes work.
  StepResult step(const Tensor& images, const Tensor& labels, int64_t first_sample, uint64_t step, uint64_t seed);

  int devices() const { return static_cast<int>(replicas_.size()); }
  Device device(int d) const { return Device(options_.device_type, d); }
  int64_t micro_batch() const { return options_.micro_batch; }
  int threads_per_device() const { return options_.threads_per_device; }
  nn::Module& replica(int device) { return *replicas_.at(device); }
  // The learning rate of every device's optimizer.
  void set_lr(double lr);
  double lr() const;
  // The optimizer state as one unsharded optimizer over a replica's parameters holds it
  // (the same for every device; under zero1 gathered from the shards; under f16 with the
  // loss scaler's entries), and its loading into every device.
  NamedTensors optimizer_state();
  void load_optimizer_state(const NamedTensors& state);
  // Bytes of optimizer state device d holds (1/devices() of the whole under zero1).
  int64_t optimizer_state_bytes(int device) const;

 private:
  // Device d's part of a step; device 0 also writes the step's loss.
  void run_device(int device, const Tensor& images, const Tensor& labels, int64_t first_sample, uint64_t step,
                  uint64_t seed, StepResult& result);

  DataParallelOptions options_;
  std::vector<std::shared_ptr<nn::Module>> replicas_;
  std::vector<FlatGradients> gradients_;
  std::vector<std::unique_ptr<optim::Optimizer>> optimizers_;  // without zero1
  std::vector<std::unique_ptr<ShardedOptimizer>> sharded_;     // with zero1
  std::vector<optim::LossScaler> scalers_;                     // f16: one per device, all alike
  std::vector<std::shared_ptr<comm::Communicator>> comms_;
  std::unique_ptr<DeviceWorkers> workers_;
};

}  // namespace lockstep::parallel
