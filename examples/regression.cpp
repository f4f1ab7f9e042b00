// Your own model, your own loss, your own data, on every device: copy this to start.
// A model with two inputs learns float targets with a mean-squared-error loss, trained by
// parallel::DataParallel on N CPU devices of this process and the library's training loop
// (train::Trainer: data order, learning-rate schedule, and with out_dir set, metrics,
// checkpoints and resume):
//
//   build/bin/regression --devices 1
//   build/bin/regression --devices 4      # the same weights_sha256, bit for bit
//
// The last line is the weights' SHA-256: it depends on (seed, global batch, micro-batch),
// never on the device count.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "lockstep/core/philox.h"
#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/train/trainer.h"

using namespace lockstep;

// y = head(relu(left(a) + right(b))): a forward of two inputs, called by the loss below.
class TwoInputModel : public nn::Module {
 public:
  TwoInputModel() : nn::Module("TwoInputModel") {
    left = register_module("left", std::make_shared<nn::Linear>(8, 32));
    right = register_module("right", std::make_shared<nn::Linear>(4, 32));
    head = register_module("head", std::make_shared<nn::Linear>(32, 1));
  }
  Tensor forward(const Tensor& a, const Tensor& b) { return (*head)(relu((*left)(a) + (*right)(b))); }
  std::shared_ptr<nn::Linear> left, right, head;
};

// The loss returns one loss per sample ([n, 1] here); the layout averages them over the
// global batch, so no device count changes the step.
Tensor squared_error(nn::Module& model, const TensorBatch& batch, const parallel::StepContext&) {
  const Tensor prediction = static_cast<TwoInputModel&>(model).forward(batch["a"], batch["b"]);
  return square(prediction - batch["y"]);
}

// n samples of a = U(-1, 1)^8, b = U(-1, 1)^4 and y = sum(a[:4] * b) + a[7], computed with
// the library's ops (not a loop here, which a compiler may fuse into multiply-adds
// differently under other flags, and so make other data).
TensorBatch synthetic_data(int64_t n, uint64_t seed) {
  Philox rng(seed, 0);
  std::vector<float> a(static_cast<size_t>(n * 8)), b(static_cast<size_t>(n * 4));
  for (float& v : a) v = 2 * uint_to_unit_float(rng.next_u32()) - 1;
  for (float& v : b) v = 2 * uint_to_unit_float(rng.next_u32()) - 1;
  const Tensor ta = Tensor::from_vector(a, {n, 8}), tb = Tensor::from_vector(b, {n, 4});
  const Tensor y = sum(slice(ta, 1, 0, 4) * tb, {1}, /*keepdim=*/true) + slice(ta, 1, 7, 8);
  return {{"a", ta}, {"b", tb}, {"y", y.contiguous()}};
}

int main(int argc, char** argv) {
  int devices = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--devices") == 0 && i + 1 < argc) {
      devices = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: regression [--devices N]  (N CPU devices: 1, 2, 4 or 8)\n");
      return 2;
    }
  }
  constexpr uint64_t kSeed = 0;
  try {
    const auto data = std::make_shared<TensorDataset>(synthetic_data(4096, kSeed));
    parallel::DataParallel dp(
        {.loss = squared_error, .devices = devices, .micro_batch = 8},
        [](int) {
          auto model = std::make_shared<TwoInputModel>();
          nn::initialize(*model, kSeed);  // the same initial weights on every device
          return model;
        },
        [](std::vector<Tensor> params) {
          return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{});
        });
    // Batches of 64 in one shuffled order per epoch, at a constant learning rate.
    train::Trainer trainer(dp, data, {.batch_size = 64, .epochs = 3, .seed = kSeed, .lr = 3e-3, .progress = false});
    const train::TrainSummary summary = trainer.fit();
    std::printf("%lld steps, mean squared error %.5f\n", static_cast<long long>(summary.steps),
                train::evaluate_loss(dp.model(), *data, squared_error));
    std::printf("weights_sha256 %s\n", summary.weights_sha256.c_str());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "regression: %s\n", error.what());
    return 1;
  }
}
