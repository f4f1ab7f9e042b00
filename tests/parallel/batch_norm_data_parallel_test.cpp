// BatchNorm under DataParallel: a small residual network trained on 1, 2 and 4 devices gives
// the same weights and the same running statistics bit for bit, with one running-statistics
// update per optimizer step (the deferred path of nn::BatchNorm, folded by the layout).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "lockstep/nn/nn.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/parallel/data_parallel.h"
#include "parallel/step_testing.h"

namespace lockstep::parallel {
namespace {

using namespace step_testing;

class SmallResNet : public nn::Module {
 public:
  SmallResNet() : Module("SmallResNet") {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1, false));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(4));
    block = register_module("block", std::make_shared<nn::BasicBlock>(4, 8, 2));
    pool = register_module("pool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
    fc = register_module("fc", std::make_shared<nn::Linear>(8, 10));
    nn::initialize(*this, kSeed);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*block)(relu((*bn1)((*conv1)(x))));
    h = (*pool)(h);
    return (*fc)(reshape(h, {h.size(0), 8}));
  }
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::BasicBlock> block;
  std::shared_ptr<nn::AdaptiveAvgPool2d> pool;
  std::shared_ptr<nn::Linear> fc;
};

// Every parameter and buffer of replica 0 after `steps` steps, as bytes.
std::vector<std::vector<char>> train(int devices, int steps) {
  DataParallel dp(
      {.loss = classification(), .devices = devices, .micro_batch = 4},
      [](int) { return std::make_shared<SmallResNet>(); },
      [](std::vector<Tensor> params) {
        return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.1});
      });
  for (int s = 0; s < steps; ++s)
    train_step(dp, synthetic(16, static_cast<uint64_t>(s)), s * 16, static_cast<uint64_t>(s));
  std::vector<std::vector<char>> state;
  for (int d = 0; d < devices; ++d) {
    for (const auto& [name, t] : dp.replica(d).named_buffers()) {
      if (name.ends_with("num_batches_tracked")) {
        EXPECT_EQ(t.item(), steps) << name << " of replica " << d;
      }
    }
  }
  for (const auto& [name, t] : dp.replica(0).state_dict()) {
    const Tensor c = t.contiguous();
    const char* p = static_cast<const char*>(c.raw_data());
    state.emplace_back(p, p + c.nbytes());
  }
  // Every replica holds the same running statistics.
  for (int d = 1; d < devices; ++d) {
    size_t k = 0;
    for (const auto& [name, t] : dp.replica(d).state_dict()) {
      const Tensor c = t.contiguous();
      EXPECT_EQ(std::memcmp(c.raw_data(), state[k++].data(), c.nbytes()), 0) << name << " of replica " << d;
    }
  }
  return state;
}

TEST(BatchNormDataParallel, RunningStatisticsAreTheSameBitsOnOneTwoAndFourDevices) {
  const auto one = train(1, 2);
  // The steps moved the running statistics (entry 3 of the state_dict is bn1.running_mean).
  EXPECT_NE(one[3], std::vector<char>(16, 0));
  for (int devices : {2, 4}) EXPECT_EQ(train(devices, 2), one) << devices << " devices";
}

}  // namespace
}  // namespace lockstep::parallel
