// For the tests of a distributed step that runs out of memory on some rank: a model with
// wide activations (the micro-batch decides the peak), running statistics, several gradient
// buckets, and a layer that can be told to throw OutOfMemoryError in one forward or
// backward (so a failure lands exactly between two buckets' collectives); the global
// batches; and CPU devices given a GPU's fixed memory for a while.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockstep/autograd/node.h"
#include "lockstep/core/allocator.h"
#include "lockstep/nn/activation.h"
#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sequential.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/parallel/distributed_data_parallel.h"

namespace lockstep::halving_testing {

constexpr int64_t kBatch = 256;

// An identity that throws OutOfMemoryError, once, in the forward or in the backward of
// its n-th forward from now: as an allocation there would.
class RunsOutOnce final : public nn::Module {
 public:
  RunsOutOnce() : Module("RunsOutOnce") {}
  void fail_forward(int n) { forward_at_ = calls_ + n; }
  void fail_backward(int n) { backward_at_ = calls_ + n; }

  Tensor forward(const Tensor& x) override {
    const int call = calls_++;
    const std::string where = "out of memory on " + x.device().str() + " (injected in ";
    if (call == forward_at_) {
      forward_at_ = -1;
      throw OutOfMemoryError(where + "forward)");
    }
    const bool fails = call == backward_at_;
    if (fails) backward_at_ = -1;
    const Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    out.copy_from(x);
    autograd::record("RunsOutOnceBackward", {x}, {out}, [fails, where](const std::vector<Tensor>& grads) {
      if (fails) throw OutOfMemoryError(where + "backward)");
      return std::vector<Tensor>{grads[0]};
    });
    return out;
  }

 private:
  int calls_ = 0;
  int forward_at_ = -1;
  int backward_at_ = -1;
};

struct Replica {
  std::shared_ptr<nn::Module> model;
  RunsOutOnce* runs_out = nullptr;
};

// The same weights on every call. Backward finishes the two last linear layers (the first
// bucket, of 4 KiB or more) before it reaches RunsOutOnce, and the rest (the second) after.
// Few parameters behind wide activations: the activations of a micro-batch of 64 outweigh
// the optimizer state, so a first step at 128 (no state yet) needs more than any step at 64.
inline Replica make_replica(Device device) {
  auto runs_out = std::make_shared<RunsOutOnce>();
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 1024), std::make_shared<nn::BatchNorm1d>(1024), std::make_shared<nn::ReLU>(),
      runs_out, std::make_shared<nn::Linear>(1024, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 1)});
  nn::initialize(*model, 11);
  model->to(device);
  return {model, runs_out.get()};
}

inline std::unique_ptr<optim::Optimizer> adamw(std::vector<Tensor> params) {
  return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 1e-2});
}

inline parallel::DistributedDataParallelOptions ddp_options(int zero_stage, int64_t micro_batch,
                                                            bool share_weights = false) {
  return {.loss = parallel::mse_loss("x", "y"),
          .micro_batch = micro_batch,
          .bucket_bytes = int64_t{64} << 10,
          .first_bucket_bytes = int64_t{4} << 10,
          .zero_stage = zero_stage,
          .share_weights = share_weights};
}

// Global batch `step` of a regression whose target a model can learn.
inline TensorBatch batch_of(int64_t step) {
  std::vector<float> x(kBatch * 8), y(kBatch);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>((i * 37 + static_cast<size_t>(step) * 11) % 101) / 101.0f - 0.5f;
  for (size_t i = 0; i < y.size(); ++i) y[i] = x[8 * i] - 0.5f * x[8 * i + 3];
  return {{"x", Tensor::from_vector(x, {kBatch, 8})}, {"y", Tensor::from_vector(y, {kBatch, 1})}};
}

inline parallel::StepContext context_of(int64_t step) {
  return {.seed = 3, .step = static_cast<uint64_t>(step), .first_sample = step * kBatch};
}

// Every CPU device's memory limited to `bytes` for the while (0: none), every cache emptied
// first so the limit meets what tensors hold.
class MemoryLimit {
 public:
  MemoryLimit(int64_t bytes, int devices) {
    for (int d = 0; d < devices; ++d) empty_cache(Device::cpu(d));
    set_cpu_device_memory_limit(bytes);
  }
  ~MemoryLimit() { set_cpu_device_memory_limit(0); }
  MemoryLimit(const MemoryLimit&) = delete;
  MemoryLimit& operator=(const MemoryLimit&) = delete;
};

}  // namespace lockstep::halving_testing
