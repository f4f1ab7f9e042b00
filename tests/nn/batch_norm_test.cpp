// BatchNorm1d/2d as layers: PyTorch's names, order and defaults, train and eval modes, the
// running-statistics update (immediate, and deferred to one update per step), and the layers
// built on them and around them: BasicBlock (torchvision's names, the composition) and
// AdaptiveAvgPool2d(1).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "lockstep/nn/nn.h"
#include "lockstep/ops/ops.h"
#include "testing/gradcheck.h"

namespace lockstep::nn {
namespace {

using testing::expect_all_close;
using testing::random_f32;
using testing::random_f64;

std::vector<std::string> names_of(const NamedTensors& tensors) {
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  return names;
}

// Channel statistics of x [N, C, ...] in f64: the mean and the unbiased variance.
struct Stats {
  std::vector<double> mean, unbiased_var;
};

Stats naive_stats(const Tensor& x) {
  const auto v = x.to_vector<double>();
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  Stats out;
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0, squares = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) sum += v[static_cast<size_t>((i * c + ch) * s + j)];
    const double mean = sum / static_cast<double>(n * s);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) squares += std::pow(v[static_cast<size_t>((i * c + ch) * s + j)] - mean, 2);
    out.mean.push_back(mean);
    out.unbiased_var.push_back(squares / static_cast<double>(n * s - 1));
  }
  return out;
}

// Buffers with values that are not the defaults, so an update that ignores them shows.
void set_running_stats(BatchNorm& bn, uint64_t seed) {
  bn.running_mean.copy_from(random_f32({bn.num_features}, seed, -0.5, 0.5));
  bn.running_var.copy_from(random_f32({bn.num_features}, seed + 1, 0.5, 2.0));
  bn.num_batches_tracked.fill(5);
}

struct Snapshot {
  std::vector<float> mean, var;
  int64_t tracked;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const BatchNorm& bn) {
  return {bn.running_mean.to_vector<float>(), bn.running_var.to_vector<float>(),
          bn.num_batches_tracked.to_vector<int64_t>()[0]};
}

// running · (1 - momentum) + momentum · stat, per channel.
std::vector<double> folded(const std::vector<float>& running, const std::vector<double>& stat, double momentum) {
  std::vector<double> out;
  for (size_t c = 0; c < running.size(); ++c) out.push_back((1 - momentum) * running[c] + momentum * stat[c]);
  return out;
}

TEST(BatchNorm, NamesOrderAndDefaultsArePytorchs) {
  BatchNorm2d bn(6);
  EXPECT_EQ(names_of(bn.state_dict()),
            (std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}));
  EXPECT_EQ(names_of(bn.named_parameters()), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(bn.eps, 1e-5);
  EXPECT_EQ(bn.momentum.value_or(-1.0), 0.1);
  EXPECT_TRUE(bn.affine);
  EXPECT_TRUE(bn.track_running_stats);
  EXPECT_EQ(bn.weight.to_vector<float>(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(bn.bias.to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(bn.running_mean.to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(bn.running_var.to_vector<float>(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(bn.num_batches_tracked.dtype(), DType::i64);
  EXPECT_EQ(bn.num_batches_tracked.shape(), Shape{});  // 0-d, as PyTorch's
  EXPECT_EQ(bn.num_batches_tracked.item(), 0);
  EXPECT_FALSE(bn.running_mean.requires_grad());

  BatchNorm1d plain(4, 1e-3, 0.2, /*affine=*/false);
  EXPECT_EQ(names_of(plain.state_dict()),
            (std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"}));
  BatchNorm1d untracked(4, 1e-5, 0.1, true, /*track_running_stats=*/false);
  EXPECT_EQ(names_of(untracked.state_dict()), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_TRUE(untracked.take_step_statistics().empty());

  // A state_dict saved by PyTorch loads: the tracked count is a 0-d i64 there too.
  BatchNorm2d other(6);
  NamedTensors state = bn.state_dict();
  state[4].second = Tensor::full({}, 7, DType::i64);
  other.load_state_dict(state);
  EXPECT_EQ(other.num_batches_tracked.item(), 7);
}

TEST(BatchNorm, TrainingUsesTheBatchAndEvalTheRunningStatistics) {
  BatchNorm2d bn(3, 1e-4);
  bn.weight.copy_from(random_f32({3}, 1));
  bn.bias.copy_from(random_f32({3}, 2));
  set_running_stats(bn, 3);
  const Tensor x = random_f32({4, 3, 2, 3}, 4, -1, 3);
  const Tensor want_train = batch_norm(x, Tensor(), Tensor(), bn.weight, bn.bias, true, 1e-4).output;
  const Tensor want_eval = batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, false, 1e-4).output;
  bn.eval();
  const Snapshot before = snapshot(bn);
  EXPECT_EQ(bn(x).to_vector<float>(), want_eval.to_vector<float>());
  EXPECT_EQ(snapshot(bn), before) << "an eval forward changed the running statistics";
  bn.train();
  EXPECT_EQ(bn(x).to_vector<float>(), want_train.to_vector<float>());
  EXPECT_NE(want_train.to_vector<float>(), want_eval.to_vector<float>());

  // Without running statistics, eval normalizes with the batch's too.
  BatchNorm1d untracked(3, 1e-4, 0.1, false, false);
  untracked.eval();
  const Tensor x1 = random_f32({5, 3, 2}, 5);
  EXPECT_EQ(untracked(x1).to_vector<float>(),
            batch_norm(x1, Tensor(), Tensor(), {}, {}, true, 1e-4).output.to_vector<float>());
}

TEST(BatchNorm, ShapesAndArgumentsAreChecked) {
  BatchNorm1d bn1(3);
  EXPECT_EQ(bn1(random_f32({4, 3}, 1)).shape(), (Shape{4, 3}));
  EXPECT_EQ(bn1(random_f32({4, 3, 5}, 2)).shape(), (Shape{4, 3, 5}));
  EXPECT_THROW(bn1(random_f32({4, 3, 2, 2}, 3)), Error);
  EXPECT_THROW(bn1(random_f32({4, 2}, 4)), Error);
  EXPECT_THROW(bn1(random_f32({1, 3}, 5)), Error);  // one value per channel in training
  BatchNorm2d bn2(3);
  EXPECT_THROW(bn2(random_f32({4, 3, 5}, 6)), Error);
  EXPECT_EQ(bn2(random_f32({2, 3, 1, 2}, 7)).shape(), (Shape{2, 3, 1, 2}));
  EXPECT_THROW(BatchNorm2d(0), Error);
  EXPECT_THROW(BatchNorm2d(3, 0.0), Error);
  EXPECT_THROW(BatchNorm2d(3, 1e-5, 1.5), Error);
  EXPECT_THROW(bn2.apply_step_statistics({Tensor::zeros({3}), Tensor::zeros({3})}), Error);
  EXPECT_THROW(bn2.apply_step_statistics({Tensor::zeros({2}), Tensor::zeros({3}), Tensor::ones({1})}), Error);
}

TEST(BatchNormRunningStats, ImmediateUpdateFollowsTheFormula) {
  BatchNorm1d bn(4, 1e-5, 0.3);
  set_running_stats(bn, 10);
  const Tensor x = random_f32({6, 4, 3}, 11, -2, 2);
  const Snapshot before = snapshot(bn);
  const Stats stats = naive_stats(x);
  bn(x);
  // The variance folded in is the unbiased one, n/(n-1) = 18/17 times what normalizes the output.
  expect_all_close(bn.running_mean, folded(before.mean, stats.mean, 0.3), 1e-6, 1e-7);
  expect_all_close(bn.running_var, folded(before.var, stats.unbiased_var, 0.3), 1e-6, 1e-7);
  EXPECT_EQ(bn.num_batches_tracked.item(), 6);
  bn(x);
  EXPECT_EQ(bn.num_batches_tracked.item(), 7);

  // momentum 0: statistics stay, the count still moves.
  BatchNorm1d frozen(4, 1e-5, 0.0);
  set_running_stats(frozen, 12);
  const Snapshot frozen_before = snapshot(frozen);
  frozen(x);
  EXPECT_EQ(frozen.running_mean.to_vector<float>(), frozen_before.mean);
  EXPECT_EQ(frozen.num_batches_tracked.item(), 6);
}

TEST(BatchNormRunningStats, NoMomentumIsTheCumulativeAverage) {
  BatchNorm2d bn(2, 1e-5, std::nullopt);
  std::vector<double> mean_sum(2, 0.0), var_sum(2, 0.0);
  for (int k = 0; k < 3; ++k) {
    const Tensor x = random_f32({3, 2, 2, 2}, 20 + static_cast<uint64_t>(k), -1, 1 + k);
    const Stats stats = naive_stats(x);
    for (size_t c = 0; c < 2; ++c) mean_sum[c] += stats.mean[c], var_sum[c] += stats.unbiased_var[c];
    bn(x);
  }
  expect_all_close(bn.running_mean, {mean_sum[0] / 3, mean_sum[1] / 3}, 1e-6, 1e-7);
  expect_all_close(bn.running_var, {var_sum[0] / 3, var_sum[1] / 3}, 1e-6, 1e-7);
  EXPECT_EQ(bn.num_batches_tracked.item(), 3);
}

TEST(BatchNormDeferred, ForwardsOnlyAddToPendingSums) {
  BatchNorm2d bn(3);
  set_running_stats(bn, 30);
  bn.defer_step_statistics();
  EXPECT_TRUE(bn.defers_step_statistics());
  const Snapshot before = snapshot(bn);
  std::vector<Tensor> batches;
  std::vector<double> mean_sum(3, 0.0), var_sum(3, 0.0);
  for (int k = 0; k < 3; ++k) {
    batches.push_back(random_f32({4, 3, 2, 2}, 31 + static_cast<uint64_t>(k), -1, 1 + k));
    const Stats stats = naive_stats(batches.back());
    for (size_t c = 0; c < 3; ++c) mean_sum[c] += stats.mean[c], var_sum[c] += stats.unbiased_var[c];
    // Training forwards still normalize with their own batch.
    EXPECT_EQ(bn(batches.back()).to_vector<float>(),
              batch_norm(batches.back(), Tensor(), Tensor(), bn.weight, bn.bias, true).output.to_vector<float>());
  }
  EXPECT_EQ(snapshot(bn), before) << "a deferred forward changed the running statistics";

  const std::vector<Tensor> sums = bn.take_step_statistics();
  ASSERT_EQ(sums.size(), 3u);
  EXPECT_EQ(sums[0].shape(), Shape{3});
  EXPECT_EQ(sums[1].shape(), Shape{3});
  EXPECT_EQ(sums[2].shape(), Shape{1});
  EXPECT_EQ(sums[0].dtype(), DType::f32);
  expect_all_close(sums[0], mean_sum, 1e-6, 1e-6);
  expect_all_close(sums[1], var_sum, 1e-6, 1e-6);
  EXPECT_EQ(sums[2].item(), 3);
  // Taking reset them.
  for (const Tensor& t : bn.take_step_statistics()) EXPECT_EQ(t.to_vector<float>(), std::vector<float>(t.numel(), 0));

  // One update with the mean of the three batches' statistics, counted once.
  bn.apply_step_statistics(sums);
  std::vector<double> mean_avg, var_avg;
  for (size_t c = 0; c < 3; ++c) mean_avg.push_back(mean_sum[c] / 3), var_avg.push_back(var_sum[c] / 3);
  expect_all_close(bn.running_mean, folded(before.mean, mean_avg, 0.1), 1e-6, 1e-7);
  expect_all_close(bn.running_var, folded(before.var, var_avg, 0.1), 1e-6, 1e-7);
  EXPECT_EQ(bn.num_batches_tracked.item(), 6);
}

TEST(BatchNormDeferred, TakeWithoutForwardChangesNothing) {
  BatchNorm1d bn(5);
  set_running_stats(bn, 40);
  bn.defer_step_statistics();
  const Snapshot before = snapshot(bn);
  const std::vector<Tensor> sums = bn.take_step_statistics();
  ASSERT_EQ(sums.size(), 3u);
  EXPECT_EQ(sums[0].to_vector<float>(), std::vector<float>(5, 0.0f));
  EXPECT_EQ(sums[1].to_vector<float>(), std::vector<float>(5, 0.0f));
  EXPECT_EQ(sums[2].to_vector<float>(), std::vector<float>{0.0f});
  bn.apply_step_statistics(sums);
  EXPECT_EQ(snapshot(bn), before);
  // An eval forward adds nothing either.
  bn.eval();
  bn(random_f32({3, 5}, 41));
  EXPECT_EQ(bn.take_step_statistics()[2].item(), 0);
}

TEST(BatchNormDeferred, OneForwardEqualsTheImmediateUpdateBitForBit) {
  BatchNorm2d immediate(4), deferred(4);
  set_running_stats(immediate, 50);
  set_running_stats(deferred, 50);
  deferred.defer_step_statistics();
  const Tensor x = random_f32({3, 4, 3, 3}, 51, -2, 2);
  immediate(x);
  deferred(x);
  deferred.apply_step_statistics(deferred.take_step_statistics());
  EXPECT_EQ(snapshot(deferred), snapshot(immediate));
}

TEST(BatchNormDeferred, SumsFromManyMicroBatchesGiveEveryReplicaTheSameBits) {
  // Two replicas: one ran micro-batches 0 and 1, the other micro-batch 2; the layout adds their sums.
  auto make = [] {
    auto bn = std::make_shared<BatchNorm1d>(3);
    set_running_stats(*bn, 60);
    bn->defer_step_statistics();
    return bn;
  };
  const auto a = make(), b = make();
  std::vector<Tensor> batches;
  for (int k = 0; k < 3; ++k) batches.push_back(random_f32({4, 3}, 61 + static_cast<uint64_t>(k), -1, 2 + k));
  (*a)(batches[0]);
  (*a)(batches[1]);
  (*b)(batches[2]);
  const std::vector<Tensor> sa = a->take_step_statistics(), sb = b->take_step_statistics();
  const std::vector<Tensor> total{sa[0] + sb[0], sa[1] + sb[1], sa[2] + sb[2]};
  EXPECT_EQ(total[2].item(), 3);
  a->apply_step_statistics(total);
  b->apply_step_statistics(total);
  EXPECT_EQ(snapshot(*a), snapshot(*b));

  // ... which is one update with the three batches' mean statistics.
  BatchNorm1d reference(3);
  set_running_stats(reference, 60);
  std::vector<double> mean(3, 0.0), var(3, 0.0);
  for (const Tensor& x : batches) {
    const Stats stats = naive_stats(x);
    for (size_t c = 0; c < 3; ++c) mean[c] += stats.mean[c] / 3, var[c] += stats.unbiased_var[c] / 3;
  }
  const Snapshot before = snapshot(reference);
  expect_all_close(a->running_mean, folded(before.mean, mean, 0.1), 1e-6, 1e-7);
  expect_all_close(a->running_var, folded(before.var, var, 0.1), 1e-6, 1e-7);
  EXPECT_EQ(a->num_batches_tracked.item(), 6);
}

// DDP ranks that keep one copy of the weights run a rank's module on activations of another
// CPU device than its buffers: the statistics join the pending sums on the buffers' device.
TEST(BatchNormDeferred, AnInputOnAnotherCpuDeviceAddsToTheBuffersDevice) {
  BatchNorm1d bn(3, 1e-5, 0.1, /*affine=*/false);
  bn.to(Device::cpu(0));
  bn.defer_step_statistics();
  const Tensor x = random_f32({5, 3}, 80, -1, 2).to(Device::cpu(1));
  bn(x);
  bn(x);
  const std::vector<Tensor> sums = bn.take_step_statistics();
  ASSERT_EQ(sums.size(), 3u);
  for (const Tensor& t : sums) EXPECT_EQ(t.device(), Device::cpu(0));
  const Stats stats = naive_stats(x);
  expect_all_close(sums[0], {2 * stats.mean[0], 2 * stats.mean[1], 2 * stats.mean[2]}, 1e-6, 1e-6);
  expect_all_close(sums[1], {2 * stats.unbiased_var[0], 2 * stats.unbiased_var[1], 2 * stats.unbiased_var[2]}, 1e-6,
                   1e-6);
  EXPECT_EQ(sums[2].item(), 2);
}

TEST(BatchNormDeferred, ParentsDeferTheirDescendants) {
  BasicBlock block(2, 4, 2);
  block.defer_step_statistics();
  std::vector<Snapshot> before;
  std::vector<BatchNorm*> norms;
  for (const auto& [name, module] : block.named_modules()) {
    if (auto* bn = dynamic_cast<BatchNorm*>(module)) norms.push_back(bn), before.push_back(snapshot(*bn));
  }
  ASSERT_EQ(norms.size(), 3u);  // bn1, bn2, downsample.1
  block(random_f32({2, 2, 4, 4}, 70));
  for (size_t i = 0; i < norms.size(); ++i) {
    EXPECT_TRUE(norms[i]->defers_step_statistics());
    EXPECT_EQ(snapshot(*norms[i]), before[i]);
    EXPECT_EQ(norms[i]->take_step_statistics()[2].item(), 1);
  }
  EXPECT_TRUE(block.conv1->take_step_statistics().empty());
}

TEST(ResidualBlock, NamesAreTorchvisions) {
  BasicBlock down(8, 16, 2);
  EXPECT_EQ(
      names_of(down.state_dict()),
      (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
                                "bn1.num_batches_tracked", "conv2.weight", "bn2.weight", "bn2.bias", "bn2.running_mean",
                                "bn2.running_var", "bn2.num_batches_tracked", "downsample.0.weight",
                                "downsample.1.weight", "downsample.1.bias", "downsample.1.running_mean",
                                "downsample.1.running_var", "downsample.1.num_batches_tracked"}));
  EXPECT_EQ(down.conv1->weight.shape(), (Shape{16, 8, 3, 3}));
  EXPECT_EQ(down.conv2->weight.shape(), (Shape{16, 16, 3, 3}));
  EXPECT_EQ(down.named_parameters()[6].second.shape(), (Shape{16, 8, 1, 1}));
  EXPECT_FALSE(down.conv1->bias.defined());
  EXPECT_FALSE(BasicBlock(8, 8).downsample);
  EXPECT_TRUE(BasicBlock(8, 16).downsample);    // channels change
  EXPECT_TRUE(BasicBlock(8, 8, 2).downsample);  // resolution changes
}

TEST(ResidualBlock, ForwardIsTheComposition) {
  for (const int64_t stride : {1, 2}) {
    BasicBlock block(3, stride == 1 ? 3 : 5, stride);
    std::vector<BatchNorm*> norms;
    for (const auto& [name, module] : block.named_modules())
      if (auto* bn = dynamic_cast<BatchNorm*>(module)) norms.push_back(bn);
    uint64_t seed = 80;
    for (BatchNorm* bn : norms) {
      bn->weight.copy_from(random_f32({bn->num_features}, seed++));
      bn->bias.copy_from(random_f32({bn->num_features}, seed++));
      set_running_stats(*bn, seed++);
    }
    block.eval();  // normalizing with the running statistics, so the children can run again below
    const Tensor x = random_f32({2, 3, 5, 5}, 90);
    auto norm = [](const BatchNorm2d& bn, const Tensor& h) {
      return batch_norm(h, bn.running_mean, bn.running_var, bn.weight, bn.bias, false).output;
    };
    Tensor h = relu(norm(*block.bn1, conv2d(x, block.conv1->weight, {}, {stride, stride}, {1, 1})));
    h = norm(*block.bn2, conv2d(h, block.conv2->weight, {}, {1, 1}, {1, 1}));
    Tensor shortcut = x;
    if (block.downsample) {
      const auto& conv = static_cast<const Conv2d&>(*(*block.downsample)[0]);
      shortcut = norm(static_cast<const BatchNorm2d&>(*(*block.downsample)[1]),
                      conv2d(x, conv.weight, {}, {stride, stride}, {0, 0}));
    }
    const Tensor out = block(x);
    EXPECT_EQ(out.shape(), (Shape{2, block.planes, stride == 1 ? 5 : 3, stride == 1 ? 5 : 3}));
    EXPECT_EQ(out.to_vector<float>(), relu(h + shortcut).to_vector<float>()) << "stride " << stride;

    block.train();
    sum(block(x)).backward();
    for (const auto& [name, p] : block.named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
  }
}

TEST(AdaptiveAvgPool, OutputSizeOneIsEachPlanesMean) {
  AdaptiveAvgPool2d pool(1);
  const Tensor x = random_f64({2, 3, 4, 5}, 100).set_requires_grad(true);
  const Tensor y = pool(x);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 1, 1}));
  const auto v = x.to_vector<double>();
  std::vector<double> want;
  for (size_t plane = 0; plane < 6; ++plane) {
    double s = 0;
    for (size_t k = 0; k < 20; ++k) s += v[plane * 20 + k];
    want.push_back(s / 20);
  }
  expect_all_close(y, want, 1e-14, 1e-14);
  testing::expect_gradients_match([&](const std::vector<Tensor>& in) { return pool(in[0]); }, {x});
  EXPECT_EQ(pool(random_f32({3, 4, 2}, 101)).shape(), (Shape{3, 1, 1}));
  EXPECT_THROW(AdaptiveAvgPool2d(2), Error);
  EXPECT_THROW(pool(random_f32({2, 3}, 102)), Error);
}

}  // namespace
}  // namespace lockstep::nn
