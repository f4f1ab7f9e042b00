// The built-in ResNet-14 (convolutions, BatchNorm with its running statistics folded once per
// step, residual adds, global average pooling, a label-smoothed loss) under DataParallel on
// CUDA devices: the GPU step is the CPU step up to rounding (weights, running statistics,
// losses, and the eval-mode logits after), and every parameter and buffer is the same bits on
// 1, 2 and (where this machine has 4) 4 GPU devices, every replica alike. Two logical devices
// may share one GPU (LOCKSTEP_CUDA_DEVICES_PER_GPU=2, as scripts/gpu-check runs these).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/autograd/grad_mode.h"
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

std::unique_ptr<DataParallel> make_resnet(DeviceType type, int devices) {
  DataParallelOptions options;
  options.loss = classification_loss("input", "target", /*label_smoothing=*/0.1);
  options.devices = devices;
  options.device_type = type;
  options.micro_batch = 8;  // the last stage's BatchNorm sees 8 · 7 · 7 values per channel
  return std::make_unique<DataParallel>(
      options, [](int) { return nn::make_model("resnet", kSeed); },
      [](std::vector<Tensor> params) {
        return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.02, .momentum = 0.9});
      });
}

// Every state_dict entry (parameters, running statistics, num_batches_tracked) as its name and
// bytes, read back from any device.
std::vector<std::string> host_state_bits(const nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : model.state_dict()) {
    const Tensor host = tensor.to(Device::cpu()).contiguous();
    out.push_back(name + ":" + std::string(static_cast<const char*>(host.raw_data()), host.nbytes()));
  }
  return out;
}

// Entry by entry, naming the first that differs (the entries are bytes: not for printing).
void expect_same_bits(const std::vector<std::string>& got, const std::vector<std::string>& want,
                      const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] == want[i]) continue;
    ADD_FAILURE() << where << ": " << want[i].substr(0, want[i].find(':')) << " differs";
    return;
  }
}

struct Trained {
  std::vector<std::string> names;
  std::vector<std::vector<double>> state;  // every state_dict entry's values, in its order
  std::vector<std::string> bits;
  std::vector<double> losses;
  std::vector<double> eval_logits;  // replica 0 in eval mode, after training
};

// Three steps of batches of 32; then replica 0's logits in eval mode on 16 other samples.
Trained train(DeviceType type, int devices) {
  const auto dp = make_resnet(type, devices);
  Trained t;
  for (int s = 0; s < 3; ++s) {
    const StepResult result =
        train_step(*dp, synthetic(32, static_cast<uint64_t>(s)), s * 32, static_cast<uint64_t>(s));
    t.losses.push_back(result.loss);
  }
  t.bits = host_state_bits(dp->replica(0));
  for (int d = 1; d < dp->devices(); ++d)
    expect_same_bits(host_state_bits(dp->replica(d)), t.bits,
                     "replica " + std::to_string(d) + " of " + std::to_string(devices));
  for (const auto& [name, tensor] : dp->replica(0).state_dict()) {
    EXPECT_EQ(tensor.device(), Device(type, 0)) << name;
    t.names.push_back(name);
    t.state.push_back(tensor.to_vector<double>());
    if (name.ends_with("num_batches_tracked")) {
      EXPECT_EQ(tensor.item(), 3) << name << ": one update per optimizer step";
    }
  }
  nn::Module& model = dp->replica(0);
  model.eval();
  NoGradGuard no_grad;
  t.eval_logits = model(synthetic(16, 99).images.to(Device(type, 0))).to_vector<double>();
  return t;
}

// 1 and 2 GPU devices, and 4 where this machine has them.
std::vector<int> gpu_device_counts() {
  std::vector<int> counts{1, 2};
  if (cuda::device_count() >= 4) counts.push_back(4);
  return counts;
}

TEST(CudaResNetDataParallel, TheGpuStepIsTheCpuStepUpToRounding) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  for (const int devices : {1, 2}) {
    if (devices > cuda::device_count()) continue;  // two GPU devices where there are (gpu-check has)
    const Trained gpu = train(DeviceType::cuda, devices);
    const Trained cpu = train(DeviceType::cpu, devices);
    ASSERT_EQ(gpu.names, cpu.names);
    for (size_t t = 0; t < gpu.state.size(); ++t) {
      ASSERT_EQ(gpu.state[t].size(), cpu.state[t].size()) << gpu.names[t];
      for (size_t i = 0; i < gpu.state[t].size(); ++i)
        ASSERT_NEAR(gpu.state[t][i], cpu.state[t][i], 1e-4 + 1e-3 * std::fabs(cpu.state[t][i]))
            << gpu.names[t] << " [" << i << "] on " << devices << " devices";
    }
    for (size_t s = 0; s < gpu.losses.size(); ++s)
      EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4) << "step " << s << " on " << devices << " devices";
    ASSERT_EQ(gpu.eval_logits.size(), cpu.eval_logits.size());
    for (size_t i = 0; i < gpu.eval_logits.size(); ++i)
      EXPECT_NEAR(gpu.eval_logits[i], cpu.eval_logits[i], 1e-4 + 1e-3 * std::fabs(cpu.eval_logits[i]))
          << "eval logit " << i << " on " << devices << " devices";
  }
}

TEST(CudaResNetDataParallel, SameBitsOnOneTwoAndFourGpuDevices) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda1, 2);
  const Trained one = train(DeviceType::cuda, 1);
  for (const int devices : gpu_device_counts()) {
    if (devices == 1) continue;
    const Trained many = train(DeviceType::cuda, devices);
    expect_same_bits(many.bits, one.bits, std::to_string(devices) + " devices against 1");
    EXPECT_EQ(many.losses, one.losses) << devices << " devices";
    EXPECT_EQ(many.eval_logits, one.eval_logits) << devices << " devices";
  }
}

}  // namespace
}  // namespace lockstep::parallel
