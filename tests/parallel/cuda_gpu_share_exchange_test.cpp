// GpuShareExchange, what DataParallel's GPU devices exchange in a step: each device's fold of
// its share of every device's sums (and of a whole entry, into a tensor of its own) is the
// CPU's tree_reduce bit for bit, and reads another device's sum only after that device's
// stream has written it, however late; the updated shares copy between devices. Skipped
// without two GPU devices; scripts/gpu-check runs it with two logical devices on one GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "lockstep/comm/slices.h"
#include "lockstep/comm/tree_reduce.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/gpu_share_exchange.h"
#include "testing/devices.h"

namespace lockstep::parallel {
namespace {

const Device kCuda0(DeviceType::cuda, 0);
const Device kCuda1(DeviceType::cuda, 1);

std::vector<float> irregular(int64_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = std::ldexp(mantissa(gen), exponent(gen));
  return values;
}

std::vector<float> cpu_fold(const std::vector<std::vector<float>>& inputs) {
  std::vector<const void*> pointers;
  for (const auto& values : inputs) pointers.push_back(values.data());
  std::vector<float> out(inputs[0].size());
  comm::tree_reduce(pointers.data(), static_cast<int>(inputs.size()), out.data(), static_cast<int64_t>(out.size()),
                    DType::f32, comm::ReduceOp::sum);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CudaGpuShareExchange, EachDeviceFoldsItsShareOfEveryDevicesSumsInTreeOrder) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda1, 2);
  const int devices = 2;
  const int64_t count = 3001;
  GpuShareExchange exchange(devices);
  std::vector<std::vector<float>> gradient_values, loss_values;
  std::vector<std::vector<Tensor>> sums(devices);
  for (int d = 0; d < devices; ++d) {
    const Device device(DeviceType::cuda, d);
    gradient_values.push_back(irregular(count, static_cast<uint32_t>(10 + d)));
    loss_values.push_back(irregular(1, static_cast<uint32_t>(20 + d)));
    Tensor gradient = Tensor::from_vector(gradient_values.back(), {count}).to(device);
    if (d == 0) {
      // Device 0's sum is written only after a long run of work on its stream: device 1 must
      // wait for it, not read what was there before.
      Tensor busy = Tensor::full({1 << 22}, 1.0, DType::f32, device);
      for (int i = 0; i < 20; ++i) busy = busy * busy;
      gradient = add(mul(slice(busy, 0, 0, count), 0.0), gradient);  // 1 * 0 + x is x exactly
    }
    sums[static_cast<size_t>(d)] = {gradient, Tensor::from_vector(loss_values.back(), {1}).to(device)};
    exchange.sums_queued(d);
  }
  std::vector<Tensor> losses;
  for (int d = 0; d < devices; ++d) {
    exchange.wait_for_sums(d);
    const Tensor& own = sums[static_cast<size_t>(d)][0];
    const comm::Slice share = comm::slice_of(count, d, devices, sizeof(float));
    exchange.fold(d, sums, 0, share.begin, slice(own, 0, share.begin, share.begin + share.size));
    losses.push_back(Tensor::empty({1}, DType::f32, own.device()));
    exchange.fold(d, sums, 1, 0, losses.back());
    exchange.updates_queued(d);
  }
  for (int d = 0; d < devices; ++d) exchange.wait_for_updates(d);
  const std::vector<float> expected = cpu_fold(gradient_values);
  for (int d = 0; d < devices; ++d) {
    const comm::Slice share = comm::slice_of(count, d, devices, sizeof(float));
    const std::vector<float> got = sums[static_cast<size_t>(d)][0].to_vector<float>();
    EXPECT_TRUE(same_bits({got.begin() + share.begin, got.begin() + share.begin + share.size},
                          {expected.begin() + share.begin, expected.begin() + share.begin + share.size}))
        << "device " << d << "'s share";
    // Outside its share, a device's sum is its own, as the others read it.
    const std::vector<float>& mine = gradient_values[static_cast<size_t>(d)];
    for (int64_t i = 0; i < count; ++i) {
      if (i >= share.begin && i < share.begin + share.size) continue;
      ASSERT_EQ(got[static_cast<size_t>(i)], mine[static_cast<size_t>(i)]) << "device " << d << " element " << i;
    }
    EXPECT_TRUE(same_bits(losses[static_cast<size_t>(d)].to_vector<float>(), cpu_fold(loss_values)))
        << "device " << d << "'s whole fold";
  }
}

TEST(CudaGpuShareExchange, CopiesElementsBetweenDevices) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda1, 2);
  const GpuShareExchange exchange(2);
  const std::vector<float> source = irregular(1000, 3), destination = irregular(1000, 4);
  const Tensor from = Tensor::from_vector(source, {10, 100}).to(kCuda0);
  const Tensor to = Tensor::from_vector(destination, {10, 100}).to(kCuda1);
  cuda::synchronize(kCuda0);  // the copy runs on cuda:1's stream, after no event of cuda:0's
  exchange.copy_elements(from, to, 304, 512);
  std::vector<float> expected = destination;
  std::copy(source.begin() + 304, source.begin() + 816, expected.begin() + 304);
  EXPECT_TRUE(same_bits(to.to_vector<float>(), expected));
}

// The count is checked before any GPU is touched: no GPU is needed, only the backend.
TEST(CudaGpuShareExchange, MoreDevicesThanOneFoldReadsAreAClearError) {
  if (!cuda::built()) GTEST_SKIP() << "this build has no CUDA backend";
  try {
    GpuShareExchange exchange(65);
    FAIL() << "an exchange between 65 devices was made";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 to 64 GPU devices, got 65"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::parallel
