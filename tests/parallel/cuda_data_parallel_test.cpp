// DataParallel over CUDA devices: the same bits on one and two GPU devices (two logical
// devices may share one GPU: LOCKSTEP_CUDA_DEVICES_PER_GPU=2), and the same step as on the
// CPU up to rounding.
#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/nn/models.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/parallel/data_parallel.h"
#include "parallel/step_testing.h"
#include "testing/devices.h"

namespace lockstep::parallel {
namespace {

using namespace step_testing;

const Device kCuda0(DeviceType::cuda, 0);
const Device kCuda1(DeviceType::cuda, 1);

Weights train(DeviceType type, int devices, const std::string& model, std::vector<double>* losses,
              DType precision = DType::f32) {
  DataParallelOptions options;
  options.loss = classification();
  options.devices = devices;
  options.device_type = type;
  options.micro_batch = 4;
  options.precision = precision;
  DataParallel dp(
      options, [&](int) { return nn::make_model(model, kSeed); },
      [](std::vector<Tensor> params) {
        return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      });
  for (int s = 0; s < 3; ++s) {
    const Data data = synthetic(32, static_cast<uint64_t>(s));
    losses->push_back(train_step(dp, data, s * 32, static_cast<uint64_t>(s)).loss);
  }
  EXPECT_EQ(dp.replica(0).parameters().front().device(), Device(type, 0));
  const Weights first = weights(dp.replica(0));
  for (int d = 1; d < devices; ++d) EXPECT_TRUE(same_bits(weights(dp.replica(d)), first)) << "replica " << d;
  return first;
}

TEST(CudaDataParallel, SameBitsOnOneAndTwoGpuDevices) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda1, 2);
  for (const std::string model : {"mlp", "cnn"}) {
    std::vector<double> one_losses, two_losses;
    const Weights one = train(DeviceType::cuda, 1, model, &one_losses);
    const Weights two = train(DeviceType::cuda, 2, model, &two_losses);
    EXPECT_TRUE(same_bits(one, two)) << model;
    EXPECT_EQ(one_losses, two_losses) << model;
  }
}

TEST(CudaDataParallel, TheGpuStepIsTheCpuStepUpToRounding) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  for (const std::string model : {"mlp", "cnn"}) {
    std::vector<double> gpu_losses, cpu_losses;
    const Weights gpu = train(DeviceType::cuda, 1, model, &gpu_losses);
    const Weights cpu = train(DeviceType::cpu, 1, model, &cpu_losses);
    ASSERT_EQ(gpu.size(), cpu.size());
    for (size_t t = 0; t < gpu.size(); ++t) {
      ASSERT_EQ(gpu[t].size(), cpu[t].size());
      for (size_t i = 0; i < gpu[t].size(); ++i)
        ASSERT_NEAR(gpu[t][i], cpu[t][i], 1e-4 + 1e-3 * std::fabs(cpu[t][i]))
            << model << " tensor " << t << " [" << i << "]";
    }
    for (size_t s = 0; s < gpu_losses.size(); ++s)
      EXPECT_NEAR(gpu_losses[s], cpu_losses[s], 1e-4) << model << " step " << s;
  }
}

TEST(CudaDataParallel, MixedPrecisionKeepsTheBitsAcrossDevicesAndTheLossNearF32) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda1, 2);
  std::vector<double> f32_losses;
  train(DeviceType::cuda, 1, "cnn", &f32_losses);
  for (const DType precision : {DType::bf16, DType::f16}) {
    std::vector<double> one_losses, two_losses;
    const Weights one = train(DeviceType::cuda, 1, "cnn", &one_losses, precision);
    const Weights two = train(DeviceType::cuda, 2, "cnn", &two_losses, precision);
    EXPECT_TRUE(same_bits(one, two)) << dtype_name(precision);
    EXPECT_EQ(one_losses, two_losses) << dtype_name(precision);
    for (size_t s = 0; s < one_losses.size(); ++s)
      EXPECT_NEAR(one_losses[s], f32_losses[s], 2e-2) << dtype_name(precision) << " step " << s;
  }
}

// The message of the Error that constructing a DataParallel with `options` throws ("" if none).
std::string construction_error(const DataParallelOptions& options) {
  try {
    DataParallel dp(
        options, [](int) { return nn::make_model("mlp", kSeed); },
        [](std::vector<Tensor> params) {
          return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.1});
        });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaDataParallel, MixedPrecisionOnCpuDevicesIsAClearError) {
  DataParallelOptions options;
  options.loss = classification();
  options.precision = DType::bf16;
  const std::string error = construction_error(options);
  EXPECT_NE(error.find("runs on GPU devices"), std::string::npos) << "'" << error << "'";
}

}  // namespace
}  // namespace lockstep::parallel
