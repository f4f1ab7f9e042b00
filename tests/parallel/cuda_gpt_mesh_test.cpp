// The GPT mesh and a Sequential's pipeline on GPU devices (logical devices may share a GPU:
// LOCKSTEP_CUDA_DEVICES_PER_GPU=2, over `local` with staging through the host; GPUs of their
// own talk over nccl): a pipeline gives one GPU device's bits, under both schedules, beside
// data parallelism and under ZeRO-1; tensor parallelism stays near it; bf16 keeps the bits
// across the cut; and the GPU step is the CPU step up to rounding. They skip without GPUs
// and run in scripts/gpu-check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>

#include "lockstep/comm/device_group.h"
#include "lockstep/core/philox.h"
#include "lockstep/nn/activation.h"
#include "lockstep/nn/dropout.h"
#include "lockstep/nn/flatten.h"
#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/sequential.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/gpt_mesh_parallel.h"
#include "lockstep/parallel/pipeline_parallel.h"
#include "parallel/step_testing.h"
#include "testing/devices.h"

namespace lockstep::parallel {
namespace {

constexpr uint64_t kSeed = 11;
constexpr int64_t kBatch = 16, kMicro = 2;
const nn::GptConfig kConfig{.vocab = 256, .context = 8, .layers = 4, .heads = 4, .width = 16};

TensorBatch text_batch(uint64_t step) {
  Philox rng(kSeed, 500 + step);
  std::vector<int64_t> tokens(static_cast<size_t>(kBatch * kConfig.context)), targets(tokens.size());
  for (int64_t& t : tokens) t = rng.next_u32() % 256;
  for (int64_t& t : targets) t = rng.next_u32() % 256;
  return {{"tokens", Tensor::from_vector(tokens, {kBatch, kConfig.context})},
          {"targets", Tensor::from_vector(targets, {kBatch, kConfig.context})}};
}

std::unique_ptr<optim::Optimizer> adamw(std::vector<Tensor> params) {
  return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
}

struct Outcome {
  std::vector<double> losses;
  std::vector<std::string> weights;  // name and host bytes of every state entry
  std::vector<std::string> optimizer_state;
};

std::vector<std::string> host_bits(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : named) {
    const Tensor host = tensor.to(Device::cpu()).contiguous();
    out.push_back(name + ":" + std::string(static_cast<const char*>(host.raw_data()), host.nbytes()));
  }
  return out;
}

Outcome run(Layout& layout, int steps) {
  Outcome outcome;
  for (int s = 0; s < steps; ++s) {
    const auto step = static_cast<uint64_t>(s);
    outcome.losses.push_back(
        layout.step(text_batch(step), {.seed = kSeed, .step = step, .first_sample = s * kBatch}).loss);
  }
  outcome.weights = host_bits(layout.model().state_dict());
  outcome.optimizer_state = host_bits(layout.optimizer_state());
  return outcome;
}

Outcome one_device(DeviceType type, int steps, DType precision = DType::f32) {
  DataParallel dp(
      {.loss = next_token_loss("tokens", "targets"),
       .devices = 1,
       .device_type = type,
       .micro_batch = kMicro,
       .precision = precision},
      [](int) { return std::make_shared<nn::Gpt>(kConfig, kSeed); }, adamw);
  return run(dp, steps);
}

Outcome on_mesh(const MeshShape& shape, int steps, PipelineSchedule schedule = PipelineSchedule::one_f_one_b,
                int zero_stage = 0, DType precision = DType::f32) {
  GptMeshOptions mesh;
  mesh.mesh = shape;
  mesh.schedule = schedule;
  mesh.micro_batch = kMicro;
  mesh.zero_stage = zero_stage;
  mesh.precision = precision;
  GptMeshParallel layout(
      {.mesh = mesh, .devices = first_devices(DeviceType::cuda, shape.size())},
      [] { return std::make_shared<nn::Gpt>(kConfig, kSeed); }, adamw);
  EXPECT_EQ(layout.local_devices(), first_devices(DeviceType::cuda, shape.size()));
  for (const auto& rank : layout.ranks())
    EXPECT_TRUE(rank->stage().parameters().front().device().is_cuda()) << "a rank's weights left its GPU";
  return run(layout, steps);
}

void expect_same(const Outcome& actual, const Outcome& expected, const std::string& what) {
  EXPECT_EQ(actual.losses, expected.losses) << what;
  EXPECT_TRUE(actual.weights == expected.weights) << what << ": the weights differ";
  EXPECT_TRUE(actual.optimizer_state == expected.optimizer_state) << what << ": the optimizer state differs";
}

TEST(CudaGptMesh, APipelineOfGpuDevicesGivesOneGpuDevicesBits) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(Device(DeviceType::cuda, 1), 2);
  std::cout << "  (the group's backend: " << comm::device_group_backend(first_devices(DeviceType::cuda, 2)) << ")\n";
  const Outcome one = one_device(DeviceType::cuda, 3);
  expect_same(on_mesh({.dp = 1, .tp = 1, .pp = 2}, 3), one, "1F1B over 2 stages");
  expect_same(on_mesh({.dp = 1, .tp = 1, .pp = 2}, 3, PipelineSchedule::gpipe), one, "GPipe over 2 stages");
  expect_same(on_mesh({.dp = 2, .tp = 1, .pp = 1}, 3), one, "2 replicas");
  expect_same(on_mesh({.dp = 2, .tp = 1, .pp = 1}, 3, PipelineSchedule::one_f_one_b, 1), one, "2 replicas, ZeRO-1");
}

TEST(CudaGptMesh, DataBesidePipelineOnFourGpuDevices) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(Device(DeviceType::cuda, 0));
  // A machine with a GPU but fewer devices lists this apart (scripts/gpu-check).
  if (cuda::device_count() < 4) GTEST_SKIP() << "needs 4 CUDA devices, this machine has " << cuda::device_count();
  const Outcome one = one_device(DeviceType::cuda, 2);
  expect_same(on_mesh({.dp = 2, .tp = 1, .pp = 2}, 2), one, "dp 2 x pp 2");
  expect_same(on_mesh({.dp = 2, .tp = 1, .pp = 2}, 2, PipelineSchedule::one_f_one_b, 1), one, "dp 2 x pp 2, ZeRO-1");
}

// Tensor parallelism sums partial products in another order: near one device, not its bits.
TEST(CudaGptMesh, TensorParallelStaysNearOneGpuDevice) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(Device(DeviceType::cuda, 1), 2);
  const Outcome one = one_device(DeviceType::cuda, 5);
  const Outcome cut = on_mesh({.dp = 1, .tp = 2, .pp = 1}, 5);
  ASSERT_EQ(cut.losses.size(), one.losses.size());
  for (size_t s = 0; s < one.losses.size(); ++s)
    EXPECT_NEAR(cut.losses[s], one.losses[s], 1e-5 * std::abs(one.losses[s])) << "loss of step " << s;
}

// bf16 rounds each product's operands, wherever its layer runs: the cut keeps the bits.
TEST(CudaGptMesh, Bf16KeepsTheBitsAcrossThePipelineAndStaysNearF32) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(Device(DeviceType::cuda, 1), 2);
  const Outcome one = one_device(DeviceType::cuda, 3, DType::bf16);
  expect_same(on_mesh({.dp = 1, .tp = 1, .pp = 2}, 3, PipelineSchedule::one_f_one_b, 0, DType::bf16), one,
              "bf16 over 2 stages");
  const Outcome f32 = one_device(DeviceType::cuda, 3);
  for (size_t s = 0; s < f32.losses.size(); ++s)
    EXPECT_NEAR(one.losses[s], f32.losses[s], 2e-2 * std::abs(f32.losses[s])) << "bf16 loss of step " << s;
}

TEST(CudaGpt, TheGpuStepIsTheCpuStepUpToRounding) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(Device(DeviceType::cuda, 0));
  const Outcome gpu = one_device(DeviceType::cuda, 5), cpu = one_device(DeviceType::cpu, 5);
  for (size_t s = 0; s < cpu.losses.size(); ++s)
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * std::abs(cpu.losses[s])) << "loss of step " << s;
  // The same run twice on the GPU: the same bits (no kernel depends on scheduling).
  expect_same(one_device(DeviceType::cuda, 5), gpu, "the GPU run again");
}

// Flatten, Linear, ReLU, Dropout, Linear, ReLU, Linear: a user's Sequential with randomness.
std::shared_ptr<nn::Sequential> make_net() {
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(784, 32), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Dropout>(0.2), std::make_shared<nn::Linear>(32, 32), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, 10)});
  nn::initialize(*net, kSeed);
  return net;
}

Outcome run_images(Layout& layout, int steps) {
  Outcome outcome;
  for (int s = 0; s < steps; ++s) {
    outcome.losses.push_back(step_testing::train_step(layout, step_testing::synthetic(kBatch, static_cast<uint64_t>(s)),
                                                      s * kBatch, static_cast<uint64_t>(s))
                                 .loss);
  }
  outcome.weights = host_bits(layout.model().state_dict());
  outcome.optimizer_state = host_bits(layout.optimizer_state());
  return outcome;
}

TEST(CudaPipelineParallel, AUsersSequentialOnGpuDevicesGivesOneGpuDevicesBits) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(Device(DeviceType::cuda, 1), 2);
  DataParallel dp(
      {.loss = step_testing::classification(), .devices = 1, .device_type = DeviceType::cuda, .micro_batch = kMicro},
      [](int) { return make_net(); }, adamw);
  const Outcome one = run_images(dp, 3);
  for (const PipelineSchedule schedule : {PipelineSchedule::one_f_one_b, PipelineSchedule::gpipe}) {
    PipelineParallel pipeline({.input = "input",
                               .loss = cross_entropy_loss_of("target"),
                               .replicas = 1,
                               .stages = 2,
                               .schedule = schedule,
                               .micro_batch = kMicro},
                              make_net, adamw, /*threads_per_device=*/1, DeviceType::cuda);
    EXPECT_EQ(pipeline.local_devices(), first_devices(DeviceType::cuda, 2));
    expect_same(run_images(pipeline, 3), one, pipeline_schedule_name(schedule));
  }
}

}  // namespace
}  // namespace lockstep::parallel
