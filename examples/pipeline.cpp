// Your own nn::Sequential cut into a pipeline: copy this to start. A small classifier is
// trained on synthetic data by parallel::PipelineParallel — 2 stages of one replica, 1F1B,
// on 2 CPU devices of this process — and the same model on one device by DataParallel; the
// two end with the same weights, bit for bit:
//
//   build/bin/pipeline                      # 2 stages
//   build/bin/pipeline --stages 4 --replicas 2
//
// The last line is the weights' SHA-256.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "lockstep/core/philox.h"
#include "lockstep/io/weights_sha256.h"
#include "lockstep/nn/activation.h"
#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sequential.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/pipeline_parallel.h"

using namespace lockstep;

// Six layers; each rank gets its own copy with the same weights (one seed).
std::shared_ptr<nn::Sequential> make_model() {
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(16, 64), std::make_shared<nn::BatchNorm1d>(64), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(64, 64), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(64, 4)});
  nn::initialize(*model, /*seed=*/0);
  return model;
}

std::unique_ptr<optim::Optimizer> make_optimizer(std::vector<Tensor> params) {
  return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 3e-3});
}

// Points x in [-1, 1]^16 labelled by the sign pattern of x0 and x1: 4 classes.
TensorBatch batch_of(int64_t n, uint64_t step) {
  Philox rng(7, step);
  std::vector<float> x(static_cast<size_t>(n * 16));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (float& v : x) v = 2 * uint_to_unit_float(rng.next_u32()) - 1;
  for (int64_t i = 0; i < n; ++i) y[static_cast<size_t>(i)] = (x[i * 16] > 0 ? 1 : 0) + (x[i * 16 + 1] > 0 ? 2 : 0);
  return {{"x", Tensor::from_vector(x, {n, 16})}, {"label", Tensor::from_vector(y, {n})}};
}

int main(int argc, char** argv) {
  int stages = 2, replicas = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--stages") == 0 && i + 1 < argc) {
      stages = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--replicas") == 0 && i + 1 < argc) {
      replicas = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: pipeline [--stages P] [--replicas D]\n");
      return 2;
    }
  }
  constexpr int64_t kBatch = 64, kMicroBatch = 8, kSteps = 200;
  try {
    // The pipeline's loss is a loss of the last layer's output: one cross-entropy per sample.
    parallel::PipelineParallel pipeline({.input = "x",
                                         .loss = parallel::cross_entropy_loss_of("label"),
                                         .replicas = replicas,
                                         .stages = stages,
                                         .micro_batch = kMicroBatch},
                                        make_model, make_optimizer);
    parallel::DataParallel one_device(
        {.loss = parallel::classification_loss("x", "label"), .micro_batch = kMicroBatch},
        [](int) { return make_model(); }, make_optimizer);
    double loss = 0;
    for (uint64_t step = 0; step < kSteps; ++step) {
      const TensorBatch batch = batch_of(kBatch, step);
      const parallel::StepContext context{.seed = 0, .step = step, .first_sample = static_cast<int64_t>(step) * kBatch};
      loss = pipeline.step(batch, context).loss;
      one_device.step(batch, context);
    }
    const std::string ours = weights_sha256(pipeline.model()), reference = weights_sha256(one_device.model());
    std::printf("%d x %d pipeline, layers per stage", replicas, stages);
    for (const int64_t n : pipeline.rank(0).layers_per_stage()) std::printf(" %lld", static_cast<long long>(n));
    std::printf(": loss %.4f after %lld steps; one device's weights: %s\n", loss, static_cast<long long>(kSteps),
                ours == reference ? "the same bits" : "DIFFERENT");
    std::printf("weights_sha256 %s\n", ours.c_str());
    return ours == reference ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pipeline: %s\n", error.what());
    return 1;
  }
}
