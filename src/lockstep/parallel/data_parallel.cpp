#include "lockstep/parallel/data_parallel.h"

#include <bit>
#include <thread>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/comm/local_communicator.h"
#include "lockstep/core/parallel.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/gradient_tree.h"

namespace lockstep::parallel {

DataParallel::DataParallel(int devices, int64_t micro_batch, const MakeReplica& make_replica,
                           const MakeOptimizer& make_optimizer)
    : micro_batch_(micro_batch) {
  LOCKSTEP_CHECK(devices >= 1) << "data parallel needs at least one device, got " << devices;
  LOCKSTEP_CHECK(micro_batch >= 1) << "the micro-batch must hold at least one sample, got " << micro_batch;
  for (int d = 0; d < devices; ++d) {
    replicas_.push_back(make_replica(d));
    optimizers_.push_back(make_optimizer(*replicas_.back()));
  }
  comms_ = comm::LocalCommunicator::create_group(devices);
}

DataParallel::~DataParallel() = default;

void DataParallel::run_device(int device, const Tensor& images, const Tensor& labels, int64_t first_sample,
                              uint64_t step, uint64_t seed, double* loss) {
  // One thread per device: some GEMM shapes give other bits when split across a different
  // team size, and the bits must not depend on how many devices share the host's cores.
  set_num_threads(1);
  nn::Module& model = *replicas_[device];
  const std::vector<Tensor> params = model.parameters();
  const int64_t batch = images.size(0);
  const int64_t per_device = batch / devices();
  const Tensor seed_gradient = Tensor::scalar(1.0 / static_cast<double>(batch));
  GradientTree tree;
  for (int64_t start = device * per_device; start < (device + 1) * per_device; start += micro_batch_) {
    const Tensor x = slice(images, 0, start, start + micro_batch_);
    const Tensor y = slice(labels, 0, start, start + micro_batch_);
    model.set_forward_context({.seed = seed, .step = step, .first_sample = first_sample + start});
    // The loss of the step is the sum over the global batch / B: each micro-batch adds its
    // sum with the same 1/B, whichever device runs it.
    const Tensor micro_loss = cross_entropy(model(x), y, Reduction::sum);
    micro_loss.backward(seed_gradient);
    std::vector<Tensor> leaf;
    leaf.reserve(params.size() + 1);
    for (const Tensor& p : params) {
      const Tensor g = p.grad();
      leaf.push_back(g.defined() ? g : Tensor::zeros(p.shape(), p.dtype(), p.device()));
      p.set_grad(Tensor());
    }
    // The loss rides along as one more leaf entry, so it is summed in the same order.
    leaf.push_back(Tensor::full({1}, micro_loss.item() / static_cast<double>(batch), DType::f64));
    tree.add_leaf(std::move(leaf));
  }
  std::vector<Tensor> sums = tree.finish();
  comm::Communicator& comm = *comms_[device];
  for (const Tensor& s : sums) comm.all_reduce(s);
  for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(sums[i]);
  if (device == 0) *loss = sums.back().data<double>()[0];
  optimizers_[device]->step();
  optimizers_[device]->zero_grad();
}

StepResult DataParallel::step(const Tensor& images, const Tensor& labels, int64_t first_sample, uint64_t step,
                              uint64_t seed) {
  const int64_t batch = images.size(0);
  LOCKSTEP_CHECK(labels.size(0) == batch) << "images hold " << batch << " samples but labels " << labels.size(0);
  LOCKSTEP_CHECK(batch % micro_batch_ == 0)
      << "the global batch (" << batch << ") must be a multiple of the micro-batch (" << micro_batch_ << ")";
  const int64_t leaves = batch / micro_batch_;
  const int64_t per_device = leaves / devices();
  LOCKSTEP_CHECK(leaves % devices() == 0 && (devices() == 1 || std::has_single_bit(static_cast<uint64_t>(per_device))))
      << "a global batch of " << batch << " in micro-batches of " << micro_batch_ << " is " << leaves
      << " micro-batches, which " << devices()
      << " devices cannot share as equal power-of-two runs (the step's tree must split at device boundaries); use "
         "a device count that leaves each device 1, 2, 4, ... micro-batches, or change --batch-size or "
         "--micro-batch";
  StepResult result;
  std::vector<std::thread> workers;
  std::vector<std::exception_ptr> errors(devices());
  for (int d = 0; d < devices(); ++d) {
    workers.emplace_back([&, d] {
      try {
        run_device(d, images, labels, first_sample, step, seed, &result.loss);
      } catch (const std::exception& error) {
        comms_[d]->abort("device " + std::to_string(d) + ": " + error.what());  // others stop waiting for it
        errors[d] = std::current_exception();
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return result;
}

}  // namespace lockstep::parallel
