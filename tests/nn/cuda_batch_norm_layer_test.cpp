// BatchNorm1d/2d as layers on each test device: the running statistics' update (at every
// forward, with a momentum and as the cumulative average, and deferred to one update per step
// as the layouts use it) stays on the module's device and follows PyTorch's formula, against
// float64 statistics computed here in naive loops; a step without forwards changes nothing;
// one deferred forward gives the immediate update's bits; eval normalizes with the running
// statistics and leaves them alone.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/nn/normalization.h"
#include "testing/device_tensors.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"

namespace lockstep::nn {
namespace {

using testing::expect_close;
using testing::random_f32;

// Each channel's mean and unbiased variance over x [N, C, ...] (on the host), in f64.
struct Stats {
  std::vector<double> mean, unbiased_var;
};

Stats naive_stats(const Tensor& x) {
  const auto v = x.to_vector<double>();
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  const auto at = [&](int64_t i, int64_t ch, int64_t k) { return v[static_cast<size_t>((i * c + ch) * s + k)]; };
  Stats out;
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0, squares = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) sum += at(i, ch, k);
    const double mean = sum / static_cast<double>(n * s);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) squares += (at(i, ch, k) - mean) * (at(i, ch, k) - mean);
    out.mean.push_back(mean);
    out.unbiased_var.push_back(squares / static_cast<double>(n * s - 1));
  }
  return out;
}

// The buffers as host values.
struct Running {
  std::vector<double> mean, var;
  int64_t tracked;
  bool operator==(const Running&) const = default;
};

Running running_of(const BatchNorm& bn) {
  return {bn.running_mean.to_vector<double>(), bn.running_var.to_vector<double>(),
          bn.num_batches_tracked.to_vector<int64_t>()[0]};
}

// Moves bn to device and gives its buffers values that are not the defaults, so an update that
// ignores them shows.
void place(BatchNorm& bn, Device device, uint64_t seed) {
  bn.to(device);
  bn.running_mean.copy_from(random_f32({bn.num_features}, seed, -0.5, 0.5));
  bn.running_var.copy_from(random_f32({bn.num_features}, seed + 1, 0.5, 2.0));
  bn.num_batches_tracked.fill(5);
}

// PyTorch's update: running = (1 - f) · running + f · stat, per channel, in f64.
void fold(std::vector<double>& running, const std::vector<double>& stat, double f) {
  for (size_t c = 0; c < running.size(); ++c) running[c] = (1 - f) * running[c] + f * stat[c];
}

void expect_running(const BatchNorm& bn, const Running& expected, Device device) {
  EXPECT_EQ(bn.running_mean.device(), device);
  EXPECT_EQ(bn.running_var.device(), device);
  EXPECT_EQ(bn.num_batches_tracked.device(), device);
  // The buffers are f32, rounded at each update.
  expect_close(bn.running_mean, expected.mean, 1e-6, 1e-7);
  expect_close(bn.running_var, expected.var, 1e-6, 1e-7);
  EXPECT_EQ(bn.num_batches_tracked.to_vector<int64_t>()[0], expected.tracked);
}

class CudaBatchNormLayer : public testing::DeviceTest {};

TEST_P(CudaBatchNormLayer, EveryTrainingForwardUpdatesTheRunningStatistics) {
  const Device device = GetParam();
  for (const std::optional<double> momentum : {std::optional<double>(0.3), std::optional<double>()}) {
    SCOPED_TRACE(momentum ? "momentum " + std::to_string(*momentum) : std::string("cumulative average"));
    BatchNorm2d bn(3, 1e-5, momentum);
    place(bn, device, 10);
    Running expected = running_of(bn);
    for (uint64_t k = 0; k < 3; ++k) {
      const Tensor x = random_f32({4, 3, 5, 5}, 20 + k, -1, 1 + static_cast<double>(k));
      bn(x.to(device));
      const Stats stats = naive_stats(x);
      expected.tracked += 1;
      const double f = momentum ? *momentum : 1.0 / static_cast<double>(expected.tracked);
      fold(expected.mean, stats.mean, f);
      fold(expected.var, stats.unbiased_var, f);  // the unbiased variance, n/(n-1) times the one that normalized
    }
    expect_running(bn, expected, device);
  }
}

TEST_P(CudaBatchNormLayer, DeferredStatisticsFoldOncePerStep) {
  const Device device = GetParam();
  BatchNorm1d bn(5);
  place(bn, device, 30);
  bn.defer_step_statistics();
  const Running before = running_of(bn);
  std::vector<double> mean_sum(5, 0.0), var_sum(5, 0.0);
  for (uint64_t k = 0; k < 3; ++k) {
    const Tensor x = random_f32({6, 5, 4}, 31 + k, -1, 2 + static_cast<double>(k));
    bn(x.to(device));
    const Stats stats = naive_stats(x);
    for (size_t c = 0; c < 5; ++c) mean_sum[c] += stats.mean[c], var_sum[c] += stats.unbiased_var[c];
  }
  EXPECT_EQ(running_of(bn), before) << "a deferred forward changed the running statistics";

  const std::vector<Tensor> sums = bn.take_step_statistics();
  ASSERT_EQ(sums.size(), 3u);
  for (const Tensor& t : sums) EXPECT_EQ(t.device(), device);
  expect_close(sums[0], mean_sum, 1e-6, 1e-6);
  expect_close(sums[1], var_sum, 1e-6, 1e-6);
  EXPECT_EQ(sums[2].item(), 3);
  bn.apply_step_statistics(sums);
  // One update with the three forwards' mean statistics, counted once.
  Running expected = before;
  std::vector<double> mean_avg, var_avg;
  for (size_t c = 0; c < 5; ++c) mean_avg.push_back(mean_sum[c] / 3), var_avg.push_back(var_sum[c] / 3);
  fold(expected.mean, mean_avg, 0.1);
  fold(expected.var, var_avg, 0.1);
  expected.tracked += 1;
  expect_running(bn, expected, device);

  // A step without forwards: a count of 0, and nothing changes.
  const Running after = running_of(bn);
  bn.apply_step_statistics(bn.take_step_statistics());
  EXPECT_EQ(running_of(bn), after);
}

TEST_P(CudaBatchNormLayer, OneDeferredForwardGivesTheImmediateUpdatesBits) {
  const Device device = GetParam();
  for (const std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
    BatchNorm2d immediate(4, 1e-5, momentum), deferred(4, 1e-5, momentum);
    place(immediate, device, 50);
    place(deferred, device, 50);
    deferred.defer_step_statistics();
    const Tensor x = random_f32({3, 4, 3, 3}, 51, -2, 2).to(device);
    immediate(x);
    deferred(x);
    deferred.apply_step_statistics(deferred.take_step_statistics());
    EXPECT_EQ(running_of(deferred), running_of(immediate)) << (momentum ? "momentum 0.1" : "cumulative average");
  }
}

TEST_P(CudaBatchNormLayer, EvalNormalizesWithTheRunningStatistics) {
  const Device device = GetParam();
  BatchNorm2d bn(3, 1e-3);
  place(bn, device, 60);
  bn.weight.copy_from(random_f32({3}, 62, 0.5, 1.5));
  bn.bias.copy_from(random_f32({3}, 63));
  bn.eval();
  const Running before = running_of(bn);
  const Tensor x = random_f32({2, 3, 4, 5}, 64, -2, 3);
  const Tensor y = bn(x.to(device));
  EXPECT_EQ(y.device(), device);
  const auto xv = x.to_vector<double>(), w = bn.weight.to_vector<double>(), b = bn.bias.to_vector<double>();
  std::vector<double> expected(xv.size());
  for (size_t j = 0; j < xv.size(); ++j) {
    const size_t c = (j / 20) % 3;
    expected[j] = (xv[j] - before.mean[c]) / std::sqrt(before.var[c] + 1e-3) * w[c] + b[c];
  }
  expect_close(y, expected, 1e-5, 1e-6);
  EXPECT_EQ(running_of(bn), before);
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaBatchNormLayer, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep::nn
