// Optimizer offload: the state lives on another device (host memory, for GPU parameters)
// and each step runs there. Here the parameters are on cpu:0 and the "host" is cpu:1, whose
// memory is counted apart: the bits are those of the step in place, the state and the
// staging buffers are on cpu:1, and cpu:0 holds none of them.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "lockstep/core/allocator.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/optim/sgd.h"
#include "testing/gradcheck.h"

namespace lockstep::optim {
namespace {

using testing::random_f64;

const Device kHost = Device::cpu(1);

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

const MakeOptimizer kAdamW = [](std::vector<Tensor> params) {
  return std::make_unique<AdamW>(std::move(params), AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
};
const MakeOptimizer kSgd = [](std::vector<Tensor> params) {
  return std::make_unique<SGD>(std::move(params), SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
};

std::vector<Tensor> make_params() {
  std::vector<Tensor> params;
  for (uint64_t i = 0; i < 3; ++i) {
    params.push_back(random_f64({17 + static_cast<int64_t>(i), 5}, 10 + i).to(DType::f32));
    params.back().set_requires_grad(true);
  }
  return params;
}

// Five steps from the same gradients; `offload_after` steps in place first (-1: never
// offloads). The parameters' bytes.
std::vector<std::vector<float>> train(const MakeOptimizer& make, int offload_after) {
  std::vector<Tensor> params = make_params();
  std::unique_ptr<Optimizer> optimizer = make(params);
  for (int s = 0; s < 5; ++s) {
    if (s == offload_after) optimizer->offload_to(kHost);
    for (size_t i = 0; i < params.size(); ++i)
      params[i].set_grad(random_f64(params[i].shape(), 100 + 10 * s + i, -2, 2).to(DType::f32));
    optimizer->step();
  }
  std::vector<std::vector<float>> out;
  for (const Tensor& p : params) out.push_back(p.to_vector<float>());
  return out;
}

TEST(OptimizerOffload, KeepsTheBitsOfTheStepInPlace) {
  for (const MakeOptimizer& make : {kAdamW, kSgd}) {
    const auto in_place = train(make, -1);
    for (int offload_after : {0, 2}) {
      const auto offloaded = train(make, offload_after);
      ASSERT_EQ(offloaded.size(), in_place.size());
      for (size_t i = 0; i < in_place.size(); ++i)
        EXPECT_EQ(std::memcmp(offloaded[i].data(), in_place[i].data(), in_place[i].size() * sizeof(float)), 0)
            << "parameter " << i << ", offloaded after " << offload_after << " steps";
    }
  }
}

TEST(OptimizerOffload, TheStateAndItsBuffersAreOnTheHost) {
  std::vector<Tensor> params = make_params();
  int64_t param_bytes = 0;
  for (const Tensor& p : params) param_bytes += p.numel() * 4;
  std::unique_ptr<Optimizer> adamw = kAdamW(params);
  adamw->offload_to(kHost);
  for (const Tensor& p : params) p.set_grad(Tensor::ones(p.shape()));
  const int64_t device_before = memory_stats(Device::cpu()).allocated_bytes;
  const int64_t host_before = memory_stats(kHost).allocated_bytes;
  adamw->step();
  adamw->step();
  // The moments (8 bytes a parameter) and the staged parameter and gradient (8 more) on the
  // host; the step counters are 8 bytes each.
  EXPECT_EQ(adamw->state_bytes(), 2 * param_bytes + 8 * 3);
  EXPECT_EQ(adamw->staging_bytes(), 2 * param_bytes);
  // The allocator rounds each of the 15 tensors up to 64 bytes.
  const int64_t host_bytes = memory_stats(kHost).allocated_bytes - host_before;
  EXPECT_GE(host_bytes, adamw->state_bytes() + adamw->staging_bytes());
  EXPECT_LT(host_bytes, adamw->state_bytes() + adamw->staging_bytes() + 15 * 64);
  EXPECT_EQ(memory_stats(Device::cpu()).allocated_bytes, device_before);
  for (const auto& [key, tensor] : adamw->state_dict()) {
    if (key == "step") continue;  // the optimizer's own count, made for the call
    EXPECT_EQ(tensor.device(), kHost) << key;
  }
  EXPECT_EQ(adamw->offload_device(), kHost);
}

// A checkpoint's state is loaded onto the host, and the run goes on as one never stopped.
TEST(OptimizerOffload, LoadedStateGoesToTheHost) {
  const auto whole = train(kAdamW, -1);
  std::vector<Tensor> params = make_params();
  std::unique_ptr<Optimizer> first = kAdamW(params);
  for (int s = 0; s < 2; ++s) {
    for (size_t i = 0; i < params.size(); ++i)
      params[i].set_grad(random_f64(params[i].shape(), 100 + 10 * s + i, -2, 2).to(DType::f32));
    first->step();
  }
  std::unique_ptr<Optimizer> resumed = kAdamW(params);
  resumed->offload_to(kHost);
  resumed->load_state_dict(first->state_dict());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(resumed->state(i, 1).device(), kHost);
  for (int s = 2; s < 5; ++s) {
    for (size_t i = 0; i < params.size(); ++i)
      params[i].set_grad(random_f64(params[i].shape(), 100 + 10 * s + i, -2, 2).to(DType::f32));
    resumed->step();
  }
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(std::memcmp(params[i].to_vector<float>().data(), whole[i].data(), whole[i].size() * sizeof(float)), 0)
        << "parameter " << i;
}

TEST(OptimizerOffload, OnlyHostMemoryTakesTheState) {
  std::unique_ptr<Optimizer> adamw = kAdamW(make_params());
  try {
    adamw->offload_to(Device(DeviceType::cuda, 0));
    FAIL() << "offloading to a GPU was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host memory, a CPU device; got cuda:0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::optim
