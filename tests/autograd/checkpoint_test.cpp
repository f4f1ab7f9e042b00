// autograd::checkpoint against the same function run without it: the very same gradients,
// fewer bytes held between forward and backward, hooks that fire once per parameter.
#include "lockstep/autograd/checkpoint.h"

#include <gtest/gtest.h>

#include <vector>

#include "lockstep/core/allocator.h"
#include "lockstep/ops/ops.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::random_f64;

struct Net {
  Tensor w0 = random_f64({8, 64}, 1).set_requires_grad(true);
  Tensor w1 = random_f64({64, 64}, 2).set_requires_grad(true);
  Tensor w2 = random_f64({64, 4}, 3).set_requires_grad(true);
  Tensor input = random_f64({16, 8}, 4);

  // The middle, checkpointed or not: three layers, the first two of whose outputs a plain
  // run keeps for backward (tanh keeps its result, matmul its input).
  Tensor middle(const Tensor& h) const { return tanh(matmul(tanh(matmul(tanh(matmul(h, w1)), w1)), w1)); }
  Tensor loss(bool checkpointed) const {
    const Tensor h = tanh(matmul(input, w0));
    const Tensor m = checkpointed ? autograd::checkpoint([this](const Tensor& t) { return middle(t); }, h) : middle(h);
    return sum(matmul(m, w2));
  }
};

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

TEST(ActivationCheckpoint, GivesTheSameGradientsBitForBit) {
  Net plain, checkpointed;
  plain.loss(false).backward();
  checkpointed.loss(true).backward();
  EXPECT_EQ(values(plain.w0.grad()), values(checkpointed.w0.grad()));  // through the checkpoint's input
  EXPECT_EQ(values(plain.w1.grad()), values(checkpointed.w1.grad()));  // inside it
  EXPECT_EQ(values(plain.w2.grad()), values(checkpointed.w2.grad()));  // after it
  // And against finite differences, so "the same" is also right.
  testing::expect_gradients_match(
      [](const std::vector<Tensor>& p) {
        const Tensor h = tanh(matmul(p[0], p[0]));
        return matmul(autograd::checkpoint([&](const Tensor& t) { return tanh(matmul(t, p[1])); }, h), p[1]);
      },
      {random_f64({3, 3}, 5).set_requires_grad(true), random_f64({3, 3}, 6).set_requires_grad(true)});
}

TEST(ActivationCheckpoint, HoldsOnlyItsInputUntilBackward) {
  const Device device = Device::cpu();
  auto held = [&](bool checkpointed) {
    Net net;
    const int64_t before = memory_stats(device).allocated_bytes;
    const Tensor loss = net.loss(checkpointed);
    const int64_t bytes = memory_stats(device).allocated_bytes - before;
    loss.backward();
    return bytes;
  };
  const int64_t plain = held(false), checkpointed = held(true);
  // Both keep the middle's input and its result; only the plain run keeps the two [16, 64]
  // f64 activations (8 KiB each) inside it.
  EXPECT_EQ(plain - checkpointed, 2 * 16 * 64 * 8) << plain << " vs " << checkpointed;
}

TEST(ActivationCheckpoint, FiresEachParametersHookOnce) {
  Net net;
  int w1_calls = 0, w0_calls = 0;
  net.w1.set_post_accumulate_grad_hook([&] { ++w1_calls; });
  net.w0.set_post_accumulate_grad_hook([&] { ++w0_calls; });
  net.loss(true).backward();
  EXPECT_EQ(w1_calls, 1);
  EXPECT_EQ(w0_calls, 1);
}

TEST(ActivationCheckpoint, JustRunsWhenNoGradientIsWanted) {
  Net net;
  const Tensor h = tanh(matmul(net.input, net.w0)).detach();  // needs no gradient
  int runs = 0;
  const Tensor y = autograd::checkpoint(
      [&](const Tensor& t) {
        ++runs;
        return net.middle(t);
      },
      h);
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(y.requires_grad());  // w1 inside was recorded as usual
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(autograd::checkpoint([&](const Tensor& t) { return net.middle(t); }, h).requires_grad());
  }
}

}  // namespace
}  // namespace lockstep
