// cuda:N tensors: copies between the host and GPUs (every dtype, strided views,
// conversions), fills, and the caching allocator's accounting. The GPU cases are skipped
// where no GPU is visible; what a user sees there (a clear error) is checked instead.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "lockstep/core/allocator.h"
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/tensor.h"
#include "lockstep/ops/elementwise.h"
#include "testing/devices.h"

namespace lockstep {
namespace {

const Device kCuda0(DeviceType::cuda, 0);
const Device kCuda1(DeviceType::cuda, 1);

std::vector<double> random_values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-100.0, 100.0);
  std::vector<double> values(static_cast<size_t>(n));
  for (double& v : values) v = std::round(dist(gen) * 8.0) / 8.0;  // exact in every float dtype's range
  return values;
}

// The bytes of a CPU tensor, for bit-exact comparisons across dtypes.
std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor dense = t.contiguous();
  std::vector<uint8_t> out(dense.nbytes());
  if (!out.empty()) std::memcpy(out.data(), dense.raw_data(), out.size());
  return out;
}

TEST(CudaTensor, WithoutAGpuTheErrorSaysWhy) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  try {
    Tensor::empty({4}, DType::f32, kCuda0);
    FAIL() << "allocating on cuda:0 without a GPU should throw";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cuda:0"), std::string::npos) << message;
    EXPECT_TRUE(message.find("no GPU is visible") != std::string::npos ||
                message.find("no CUDA backend") != std::string::npos)
        << message;
  }
  EXPECT_THROW(memory_stats(kCuda0), Error);
  // The reason is kept, whatever it is here: no backend, no driver, a driver too old.
  EXPECT_FALSE(cuda::unavailable_reason().empty());
}

// The GPU check sets LOCKSTEP_REQUIRE_CUDA=1: there, a CUDA test that finds no GPU fails,
// saying why, instead of skipping (a run that reports green without a GPU is no check).
TEST(CudaTensor, RequiringCudaTurnsASkipIntoAFailure) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  if (std::getenv("LOCKSTEP_REQUIRE_CUDA") != nullptr) GTEST_SKIP() << "this is the child run";
  const std::string self = std::filesystem::read_symlink("/proc/self/exe");
  const std::string command =
      "LOCKSTEP_REQUIRE_CUDA=1 " + self + " --gtest_filter='Devices/CudaElementwise.*/cuda' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  const int status = pclose(pipe);
  EXPECT_NE(status, 0) << output;
  EXPECT_NE(output.find("(LOCKSTEP_REQUIRE_CUDA=1: a GPU must be there)"), std::string::npos) << output;
  EXPECT_EQ(output.find("[  SKIPPED ]"), std::string::npos) << output;
}

TEST(CudaTensor, FillKeepsNegativeZeroOnTheCpu) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor t = Tensor::full({5}, 1.0, dtype);
    t.fill(-0.0);
    for (double v : t.to_vector<double>()) EXPECT_TRUE(v == 0.0 && std::signbit(v)) << dtype_name(dtype);
  }
}

TEST(CudaTensor, RoundTripsEveryDtype) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  const std::vector<double> values = random_values(1000, 1);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    const Tensor host = Tensor::from_vector<double>(values, {10, 100}).to(dtype);
    const Tensor device = host.to(kCuda0);
    EXPECT_EQ(device.device(), kCuda0);
    EXPECT_EQ(bytes_of(device.to(Device::cpu())), bytes_of(host)) << dtype_name(dtype);
  }
}

// Host-to-device copies are only queued (through pinned staging blocks): the host buffer may
// change at once, many copies may be in flight behind a long kernel, and each still lands
// with the bytes it had when it was asked for. A staging block served again too early would
// give a later copy's bytes to an earlier one.
TEST(CudaTensor, QueuedUploadsKeepTheBytesTheyWereGiven) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  // Work for the stream, so the uploads queue behind it.
  Tensor busy = Tensor::full({1 << 22}, 1.0, DType::f32).to(kCuda0);
  for (int i = 0; i < 20; ++i) busy = busy * busy;
  Tensor host = Tensor::empty({3, 1000}, DType::f32);
  std::vector<Tensor> uploads;
  for (int i = 0; i < 64; ++i) {
    host.fill(static_cast<double>(i));
    uploads.push_back(host.to(kCuda0));  // the next fill overwrites the host buffer at once
  }
  // Larger than a staging block's limit: the driver's waiting path.
  const std::vector<double> big_values = random_values((int64_t{80} << 20) / 4, 3);
  const Tensor big = Tensor::from_vector<double>(big_values, {static_cast<int64_t>(big_values.size())}).to(DType::f32);
  const Tensor big_device = big.to(kCuda0);
  for (int i = 0; i < 64; ++i) {
    const Tensor back = uploads[static_cast<size_t>(i)].to(Device::cpu());
    EXPECT_EQ(bytes_of(back), bytes_of(Tensor::full({3, 1000}, static_cast<double>(i), DType::f32))) << "upload " << i;
  }
  EXPECT_EQ(bytes_of(big_device.to(Device::cpu())), bytes_of(big));
}

TEST(CudaTensor, ConvertsOnTheGpuAsTheCpuDoes) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  std::vector<double> values = random_values(777, 2);
  values[0] = 1.0 + 1.0 / 512;  // ties and near-ties of the 16-bit roundings
  values[1] = 65519.0;
  values[2] = 1e-6;
  values[3] = -0.0;
  values[4] = std::nan("");
  values[5] = 1e39;     // inf in f32, bf16 and f16
  values[6] = -3.7e12;  // past every integer type but i64
  values[7] = 300.5;    // past u8
  for (DType from : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    const Tensor host = Tensor::from_vector<double>(values, {777}).to(from);
    const Tensor device = host.to(kCuda0);
    for (DType to : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
      EXPECT_EQ(bytes_of(device.to(to).to(Device::cpu())), bytes_of(host.to(to)))
          << dtype_name(from) << " -> " << dtype_name(to);
    }
  }
}

TEST(CudaTensor, CopiesStridedViewsBothWays) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  const std::vector<double> values = random_values(6 * 35, 3);
  const Tensor host = Tensor::from_vector<double>(values, {6, 35}).to(DType::f32);
  const Tensor transposed = host.as_strided({35, 6}, {1, 35}, 0);
  // A strided host view to the GPU, and a strided GPU view back.
  EXPECT_EQ(transposed.to(kCuda0).to(Device::cpu()).to_vector<float>(), transposed.to_vector<float>());
  const Tensor device = host.to(kCuda0);
  const Tensor device_column = device.as_strided({6}, {35}, 4);
  EXPECT_EQ(device_column.to(Device::cpu()).to_vector<float>(), host.as_strided({6}, {35}, 4).to_vector<float>());
  // Into a strided GPU destination.
  const Tensor target = Tensor::zeros({35, 6}, DType::f64, kCuda0);
  target.as_strided({6, 35}, {1, 6}, 0).copy_from(host);
  EXPECT_EQ(target.to(Device::cpu()).to_vector<double>(), transposed.to_vector<double>());
}

TEST(CudaTensor, FillsWithEveryValue) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i64}) {
    for (double value : {0.0, -0.0, 1.5, -3.0}) {
      const Tensor device = Tensor::full({3, 33}, value, dtype, kCuda0);
      EXPECT_EQ(bytes_of(device.to(Device::cpu())), bytes_of(Tensor::full({3, 33}, value, dtype)))
          << dtype_name(dtype) << " " << value;
    }
  }
  const Tensor t = Tensor::zeros({4, 5}, DType::f32, kCuda0);
  t.as_strided({4}, {5}, 2).fill(7.0);  // column 2 only
  const std::vector<float> out = t.to(Device::cpu()).to_vector<float>();
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], i % 5 == 2 ? 7.0f : 0.0f) << i;
}

TEST(CudaTensor, CopiesBetweenDevices) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda1, 2);
  const std::vector<double> values = random_values(5000, 4);
  const Tensor host = Tensor::from_vector<double>(values, {50, 100}).to(DType::f32);
  const Tensor on0 = host.to(kCuda0);
  const Tensor on1 = on0.to(kCuda1);
  EXPECT_EQ(on1.device(), kCuda1);
  EXPECT_EQ(on1.to(Device::cpu()).to_vector<float>(), host.to_vector<float>());
  // A strided source, converted on arrival.
  const Tensor converted = Tensor::empty({100, 50}, DType::f64, kCuda1);
  converted.copy_from(on0.as_strided({100, 50}, {1, 100}, 0));
  EXPECT_EQ(converted.to(Device::cpu()).to_vector<double>(),
            host.as_strided({100, 50}, {1, 100}, 0).to_vector<double>());
}

TEST(CudaTensor, TheCachingAllocatorCountsAndReuses) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  empty_cache(kCuda0);
  const MemoryStats before = memory_stats(kCuda0);
  const int64_t mib = 1 << 20;
  {
    const Tensor a = Tensor::empty({mib / 4}, DType::f32, kCuda0);  // 1 MiB: rounds to 2 MiB
    const MemoryStats held = memory_stats(kCuda0);
    EXPECT_EQ(held.allocated_bytes - before.allocated_bytes, 2 * mib);
    EXPECT_EQ(held.reserved_bytes - before.reserved_bytes, 2 * mib);
    EXPECT_GE(held.peak_allocated_bytes, held.allocated_bytes);
  }
  const MemoryStats freed = memory_stats(kCuda0);
  EXPECT_EQ(freed.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(freed.reserved_bytes - before.reserved_bytes, 2 * mib);  // kept for reuse
  {
    const Tensor b = Tensor::empty({mib / 4 + 5}, DType::f32, kCuda0);     // the same 2 MiB class
    EXPECT_EQ(memory_stats(kCuda0).reserved_bytes, freed.reserved_bytes);  // no new cudaMalloc
    EXPECT_EQ(memory_stats(kCuda0).allocations, freed.allocations + 1);
  }
  reset_peak_memory_stats(kCuda0);
  EXPECT_EQ(memory_stats(kCuda0).peak_allocated_bytes, memory_stats(kCuda0).allocated_bytes);
  empty_cache(kCuda0);
  EXPECT_EQ(memory_stats(kCuda0).reserved_bytes, memory_stats(kCuda0).allocated_bytes);
  // Small tensors round to 512 bytes.
  const Tensor small = Tensor::empty({3}, DType::f32, kCuda0);
  EXPECT_EQ(memory_stats(kCuda0).allocated_bytes - before.allocated_bytes, 512);
}

TEST(CudaTensor, OutOfMemoryNamesTheDeviceAndTheSizes) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  try {
    Tensor::empty({int64_t{1} << 50}, DType::f32, kCuda0);  // 4 PiB
    FAIL() << "a 4 PiB tensor should not fit";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("out of memory on cuda:0"), std::string::npos) << message;
    EXPECT_NE(message.find("--batch-size"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace lockstep
