// Single-process data parallelism (the nn.DataParallel / MirroredStrategy way, done right):
// one replica of the model per device, made once; each step the global batch is cut into
// micro-batches in sample order, each device runs a contiguous run of them on its own
// worker thread and folds their gradients as its subtree of the step's tree, the `local`
// communicator folds the top of the tree across devices, and every replica takes the same
// optimizer step. For a fixed (seed, global batch, micro-batch) the weights are the same
// bits on any number of devices whose share of micro-batches is a power of two.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/nn/module.h"
#include "lockstep/optim/optimizer.h"

namespace lockstep::parallel {

struct StepResult {
  double loss = 0;  // mean cross-entropy over the global batch, summed in tree order
};

class DataParallel {
 public:
  using MakeReplica = std::function<std::shared_ptr<nn::Module>(int device)>;
  using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(nn::Module& replica)>;

  // make_replica(d) must give the same initial weights for every d (e.g. one seed).
  // micro_batch: samples per micro-batch, the leaf of the step's tree.
  DataParallel(int devices, int64_t micro_batch, const MakeReplica& make_replica, const MakeOptimizer& make_optimizer);
  ~DataParallel();

  // One optimizer step on a global batch (images [B, ...], labels [B]) whose first sample
  // has global index first_sample (dropout masks are keyed by it). B must be a multiple of
  // micro_batch, and B / micro_batch a multiple of devices() whose quotient is a power of
  // two; the error says which sizes work.
  StepResult step(const Tensor& images, const Tensor& labels, int64_t first_sample, uint64_t step, uint64_t seed);

  int devices() const { return static_cast<int>(replicas_.size()); }
  int64_t micro_batch() const { return micro_batch_; }
  nn::Module& replica(int device) { return *replicas_.at(device); }
  optim::Optimizer& optimizer(int device) { return *optimizers_.at(device); }

 private:
  // Device d's part of a step; returns its loss sum (already scaled by 1/B).
  void run_device(int device, const Tensor& images, const Tensor& labels, int64_t first_sample, uint64_t step,
                  uint64_t seed, double* loss);

  int64_t micro_batch_;
  std::vector<std::shared_ptr<nn::Module>> replicas_;
  std::vector<std::unique_ptr<optim::Optimizer>> optimizers_;
  std::vector<std::shared_ptr<comm::Communicator>> comms_;
};

}  // namespace lockstep::parallel
