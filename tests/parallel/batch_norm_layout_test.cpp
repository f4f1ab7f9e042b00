// BatchNorm under the layouts: batch statistics are each micro-batch's, and the running
// statistics are folded once per step in the step's tree order, so the weights AND the
// running statistics are the same bits on 1, 2 and 4 devices under DataParallel, DDP and
// ZeRO-1; the folded update is one update with the mean of the micro-batches' statistics,
// checked against those computed from the data in float64.
#include <gtest/gtest.h>

#include <cstring>

#include "lockstep/nn/activation.h"
#include "lockstep/nn/conv.h"
#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "parallel/rank_threads.h"
#include "parallel/step_testing.h"

namespace lockstep::parallel {
namespace {

using namespace step_testing;
using rank_threads::run_ranks;

// conv - BatchNorm2d - relu - global average pool - BatchNorm1d - linear.
class BatchNormNet : public nn::Module {
 public:
  BatchNormNet() : nn::Module("BatchNormNet") {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1, false));
    bn2d = register_module("bn2d", std::make_shared<nn::BatchNorm2d>(4));
    pool = register_module("pool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
    bn1d = register_module("bn1d", std::make_shared<nn::BatchNorm1d>(4));
    head = register_module("head", std::make_shared<nn::Linear>(4, 10));
    nn::initialize(*this, kSeed);
  }
  Tensor forward(const Tensor& x) override {
    const Tensor features = (*pool)(relu((*bn2d)((*conv)(reshape(x, {x.size(0), 1, 28, 28})))));
    return (*head)((*bn1d)(reshape(features, {x.size(0), 4})));
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn2d;
  std::shared_ptr<nn::AdaptiveAvgPool2d> pool;
  std::shared_ptr<nn::BatchNorm1d> bn1d;
  std::shared_ptr<nn::Linear> head;
};

std::unique_ptr<optim::Optimizer> sgd(std::vector<Tensor> params) {
  return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

constexpr int64_t kBatch = 16, kMicro = 2;
constexpr int kSteps = 3;

std::vector<std::string> train_dp(int devices) {
  DataParallel dp(
      {.loss = classification(), .devices = devices, .micro_batch = kMicro},
      [](int) { return std::make_shared<BatchNormNet>(); }, sgd);
  for (int s = 0; s < kSteps; ++s)
    train_step(dp, synthetic(kBatch, static_cast<uint64_t>(s)), s * kBatch, static_cast<uint64_t>(s));
  for (int d = 1; d < devices; ++d)
    EXPECT_EQ(state_bits(dp.replica(d)), state_bits(dp.model())) << "replica " << d << " drifted";
  return state_bits(dp.model());
}

std::vector<std::vector<std::string>> train_ddp(int ranks, int zero_stage) {
  std::vector<std::vector<std::string>> out(static_cast<size_t>(ranks));
  const auto errors = run_ranks(ranks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    auto model = std::make_shared<BatchNormNet>();
    DistributedDataParallel ddp(model, sgd, comm,
                                {.loss = classification(), .micro_batch = kMicro, .zero_stage = zero_stage});
    for (int s = 0; s < kSteps; ++s)
      train_step(ddp, synthetic(kBatch, static_cast<uint64_t>(s)), s * kBatch, static_cast<uint64_t>(s));
    out[static_cast<size_t>(rank)] = state_bits(*model);
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  return out;
}

TEST(DataParallelBatchNorm, WeightsAndRunningStatisticsHaveTheSameBitsOnEveryLayout) {
  const std::vector<std::string> one = train_dp(1);
  EXPECT_NE(one, state_bits(BatchNormNet())) << "training changed nothing";
  for (int devices : {2, 4}) EXPECT_EQ(train_dp(devices), one) << "dp " << devices;
  for (int ranks : {2, 4}) {
    for (int zero_stage : {0, 1, 2}) {
      const auto ranks_state = train_ddp(ranks, zero_stage);
      for (int r = 0; r < ranks; ++r)
        EXPECT_EQ(ranks_state[static_cast<size_t>(r)], one)
            << "zero stage " << zero_stage << ", " << ranks << ", rank " << r;
    }
  }
}

// A BatchNorm1d over the raw features: after one step, running_mean = 0.9 * 0 + 0.1 * (the
// mean over micro-batches of each micro-batch's mean), running_var likewise with the
// unbiased variances, num_batches_tracked = 1 — computed here from the data in float64.
class NormalizedLinear : public nn::Module {
 public:
  NormalizedLinear() : nn::Module("NormalizedLinear") {
    bn = register_module("bn", std::make_shared<nn::BatchNorm1d>(3));
    head = register_module("head", std::make_shared<nn::Linear>(3, 10));
    nn::initialize(*this, kSeed);
  }
  Tensor forward(const Tensor& x) override { return (*head)((*bn)(x)); }
  std::shared_ptr<nn::BatchNorm1d> bn;
  std::shared_ptr<nn::Linear> head;
};

TEST(DataParallelBatchNorm, OneStepIsOneUpdateWithTheMicroBatchesMeanStatistics) {
  Philox rng(kSeed, 77);
  std::vector<float> x(static_cast<size_t>(kBatch * 3));
  for (float& v : x) v = 4 * uint_to_unit_float(rng.next_u32()) - 1;
  std::vector<int64_t> y(static_cast<size_t>(kBatch));
  for (int64_t& v : y) v = rng.next_u32() % 10;
  const TensorBatch batch{{"input", Tensor::from_vector(x, {kBatch, 3})}, {"target", Tensor::from_vector(y, {kBatch})}};

  std::vector<double> mean(3, 0), var(3, 0);
  const int64_t micro_batches = kBatch / kMicro;
  for (int64_t m = 0; m < micro_batches; ++m) {
    for (size_t c = 0; c < 3; ++c) {
      double sum = 0, square_sum = 0;
      for (int64_t i = m * kMicro; i < (m + 1) * kMicro; ++i) sum += x[static_cast<size_t>(i * 3) + c];
      const double mb_mean = sum / kMicro;
      for (int64_t i = m * kMicro; i < (m + 1) * kMicro; ++i)
        square_sum += (x[static_cast<size_t>(i * 3) + c] - mb_mean) * (x[static_cast<size_t>(i * 3) + c] - mb_mean);
      mean[c] += mb_mean / static_cast<double>(micro_batches);
      var[c] += square_sum / (kMicro - 1) / static_cast<double>(micro_batches);
    }
  }
  for (int devices : {1, 4}) {
    DataParallel dp(
        {.loss = classification(), .devices = devices, .micro_batch = kMicro},
        [](int) { return std::make_shared<NormalizedLinear>(); }, sgd);
    dp.step(batch, {.seed = kSeed, .step = 0, .first_sample = 0});
    const nn::BatchNorm1d& bn = *static_cast<NormalizedLinear&>(dp.model()).bn;
    const std::vector<float> running_mean = bn.running_mean.to_vector<float>();
    const std::vector<float> running_var = bn.running_var.to_vector<float>();
    for (size_t c = 0; c < 3; ++c) {
      EXPECT_NEAR(running_mean[c], 0.1 * mean[c], 1e-6) << devices << " devices, channel " << c;
      EXPECT_NEAR(running_var[c], 0.9 + 0.1 * var[c], 1e-6) << devices << " devices, channel " << c;
    }
    EXPECT_EQ(bn.num_batches_tracked.to_vector<int64_t>(), (std::vector<int64_t>{1}));
  }
}

}  // namespace
}  // namespace lockstep::parallel
