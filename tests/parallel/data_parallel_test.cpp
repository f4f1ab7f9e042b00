// Single-process data parallelism: the same bits for every number of devices and every
// split between devices and micro-batches of one (seed, global batch, micro-batch); the
// same step as one device's plain full-batch step up to rounding; a clear error for
// layouts the tree cannot take.
#include "lockstep/parallel/data_parallel.h"

#include <gtest/gtest.h>

#include <cstring>

#include "lockstep/core/parallel.h"
#include "lockstep/core/philox.h"
#include "lockstep/nn/models.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/sgd.h"
#include "testing/gradcheck.h"

namespace lockstep::parallel {
namespace {

constexpr uint64_t kSeed = 7;

struct Data {
  Tensor images, labels;
};

Data synthetic(int64_t batch, uint64_t step) {
  Philox rng(kSeed, 1000 + step);
  std::vector<float> pixels(static_cast<size_t>(batch) * 784);
  for (float& p : pixels) p = uint_to_unit_float(rng.next_u32());
  std::vector<int64_t> labels(static_cast<size_t>(batch));
  for (int64_t& l : labels) l = static_cast<int64_t>(rng.next_u32() % 10);
  return {Tensor::from_vector(pixels, {batch, 1, 28, 28}), Tensor::from_vector(labels, {batch})};
}

std::vector<std::vector<float>> weights(nn::Module& model) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : model.parameters()) out.push_back(p.to_vector<float>());
  return out;
}

// Trains `steps` steps of a global batch on `devices` devices and returns device 0's weights.
std::vector<std::vector<float>> train(const std::string& model_name, int devices, int64_t batch, int64_t micro,
                                      int steps, std::vector<double>* losses = nullptr, int threads_per_device = 1) {
  DataParallel dp(
      {.devices = devices, .micro_batch = micro, .threads_per_device = threads_per_device},
      [&](int) { return nn::make_model(model_name, kSeed); },
      [](nn::Module& m) {
        return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      });
  for (int s = 0; s < steps; ++s) {
    const Data data = synthetic(batch, static_cast<uint64_t>(s));
    const StepResult result = dp.step(data.images, data.labels, s * batch, static_cast<uint64_t>(s), kSeed);
    if (losses) losses->push_back(result.loss);
  }
  const auto first = weights(dp.replica(0));
  for (int d = 1; d < devices; ++d) EXPECT_EQ(weights(dp.replica(d)), first) << "replica " << d << " drifted";
  return first;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0) return false;
  }
  return true;
}

TEST(DataParallel, SameBitsOnOneTwoFourAndEightDevices) {
  std::vector<double> one_losses;
  const auto one = train("mlp", 1, 32, 4, 3, &one_losses);
  for (int devices : {2, 4, 8}) {
    std::vector<double> losses;
    EXPECT_TRUE(same_bits(train("mlp", devices, 32, 4, 3, &losses), one)) << devices << " devices";
    EXPECT_EQ(losses, one_losses) << devices << " devices";
  }
}

TEST(DataParallel, SameBitsWithAnyNumberOfThreadsPerDevice) {
  // One device with 2 or 3 threads against 2 devices with one each: the products are cut
  // by shape, never by team size (a batch of 4 once split by team size, with other bits).
  const auto two_devices = train("mlp", 2, 8, 4, 2);
  EXPECT_TRUE(same_bits(train("mlp", 1, 8, 4, 2, nullptr, 2), two_devices));
  EXPECT_TRUE(same_bits(train("mlp", 1, 8, 4, 2, nullptr, 3), two_devices));
  EXPECT_TRUE(same_bits(train("cnn", 1, 16, 8, 1, nullptr, 2), train("cnn", 2, 16, 8, 1)));
}

TEST(DataParallel, OddDeviceCountsWithPowerOfTwoShares) {
  // 12 micro-batches: 3 devices x 4, 6 x 2, 12 x 1 are all the same tree as 1 x 12.
  const auto one = train("mlp", 1, 48, 4, 2);
  for (int devices : {3, 6, 12}) EXPECT_TRUE(same_bits(train("mlp", devices, 48, 4, 2), one)) << devices;
}

TEST(DataParallel, TheMicroBatchIsPartOfTheAnswer) {
  // Different leaves make a different (equally valid) sum: the bits may differ, the values
  // hardly. This is why the micro-batch is part of what defines a run.
  const auto m4 = train("mlp", 1, 32, 4, 2);
  const auto m8 = train("mlp", 1, 32, 8, 2);
  for (size_t i = 0; i < m4.size(); ++i) {
    for (size_t j = 0; j < m4[i].size(); ++j) ASSERT_NEAR(m4[i][j], m8[i][j], 1e-4);
  }
}

TEST(DataParallel, CnnWithDropoutKeyedBySampleIsTheSameOnTwoDevices) {
  const auto one = train("cnn", 1, 16, 4, 2);
  EXPECT_TRUE(same_bits(train("cnn", 2, 16, 4, 2), one));
  EXPECT_TRUE(same_bits(train("cnn", 4, 16, 4, 2), one));
}

TEST(DataParallel, MatchesAPlainFullBatchStep) {
  // One device, one micro-batch of the whole batch: the ordinary mean-loss step, on one
  // thread like DataParallel's devices (and so no OpenMP team, which ThreadSanitizer cannot
  // see into).
  const int threads = num_threads();
  set_num_threads(1);
  auto model = nn::make_model("mlp", kSeed);
  optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  const Data data = synthetic(32, 0);
  model->set_forward_context({.seed = kSeed, .step = 0, .first_sample = 0});
  cross_entropy((*model)(data.images), data.labels).backward();
  sgd.step();
  set_num_threads(threads);
  const auto reference = weights(*model);
  const auto ours = train("mlp", 4, 32, 8, 1);
  for (size_t i = 0; i < ours.size(); ++i) {
    for (size_t j = 0; j < ours[i].size(); ++j) ASSERT_NEAR(ours[i][j], reference[i][j], 1e-6) << i << "/" << j;
  }
}

TEST(DataParallel, ReportsWhereEachDevicesTimeWent) {
  DataParallel dp(
      {.devices = 2, .micro_batch = 4}, [](int) { return nn::make_model("mlp", kSeed); },
      [](nn::Module& m) { return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.1}); });
  const Data data = synthetic(16, 0);
  const StepResult result = dp.step(data.images, data.labels, 0, 0, kSeed);
  ASSERT_EQ(result.devices.size(), 2u);
  for (const DeviceTimes& t : result.devices) {
    EXPECT_GT(t.compute, 0);
    EXPECT_GE(t.wait, 0);
    EXPECT_GT(t.communicate, 0);
    EXPECT_GT(t.optimizer, 0);
  }
  EXPECT_GT(result.loss, 0);
}

TEST(DataParallel, AFailingDeviceNamesItsOwnErrorAndStopsTheOthers) {
  DataParallel dp(
      {.devices = 2, .micro_batch = 4}, [](int) { return nn::make_model("mlp", kSeed); },
      [](nn::Module& m) { return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.1}); });
  Data data = synthetic(8, 0);
  data.labels.data<int64_t>()[6] = 10;  // device 1's micro-batch: no class 10
  try {
    dp.step(data.images, data.labels, 0, 0, kSeed);
    FAIL() << "a bad label was accepted";
  } catch (const Error& error) {
    // The cause, not the abort it caused on device 0.
    EXPECT_NE(std::string(error.what()).find("10"), std::string::npos) << error.what();
    EXPECT_EQ(std::string(error.what()).find("abort"), std::string::npos) << error.what();
  }
}

TEST(DataParallel, LayoutsTheTreeCannotTakeAreExplained) {
  DataParallel dp(
      {.devices = 4, .micro_batch = 4}, [](int) { return nn::make_model("mlp", kSeed); },
      [](nn::Module& m) { return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.1}); });
  const Data bad_share = synthetic(48, 0);  // 12 micro-batches: 3 per device, not a power of two
  try {
    dp.step(bad_share.images, bad_share.labels, 0, 0, kSeed);
    FAIL() << "an uneven layout was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("12 micro-batches, which 4 devices cannot share"), std::string::npos)
        << error.what();
  }
  const Data ragged = synthetic(30, 0);
  EXPECT_THROW(dp.step(ragged.images, ragged.labels, 0, 0, kSeed), Error);
}

}  // namespace
}  // namespace lockstep::parallel
