// CPU devices with a GPU's fixed memory (set_cpu_device_memory_limit, or
// LOCKSTEP_CPU_DEVICE_MEMORY): an allocation past it gives its cached blocks back first and
// then fails with OutOfMemoryError naming the device and the limit, as a GPU's would; what
// fits after a free fits again.
#include <gtest/gtest.h>

#include "lockstep/core/allocator.h"
#include "lockstep/core/error.h"
#include "lockstep/core/tensor.h"

namespace lockstep {
namespace {

constexpr int64_t kMiB = 1 << 20;

class CpuDeviceMemoryLimit : public ::testing::Test {
 protected:
  void SetUp() override {
    empty_cache(device);
    set_cpu_device_memory_limit(kMiB);
  }
  void TearDown() override { set_cpu_device_memory_limit(0); }
  const Device device = Device::cpu(1);
};

Tensor floats(int64_t count, Device device) { return Tensor::empty({count}, DType::f32, device); }

TEST_F(CpuDeviceMemoryLimit, AnAllocationPastTheLimitFailsAndNamesIt) {
  EXPECT_EQ(cpu_device_memory_limit(), kMiB);
  Tensor first = floats(150'000, device);  // 600 kB
  try {
    (void)floats(150'000, device);
    ADD_FAILURE() << "1.2 MB fitted into 1 MiB";
  } catch (const OutOfMemoryError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("out of memory on cpu:1: tried to allocate 0.6 MiB"), std::string::npos) << message;
    EXPECT_NE(message.find("1.0 MiB in all (LOCKSTEP_CPU_DEVICE_MEMORY)"), std::string::npos) << message;
    EXPECT_NE(message.find("use a smaller micro-batch"), std::string::npos) << message;
  }
  first = Tensor();
  EXPECT_NO_THROW((void)floats(150'000, device)) << "the freed block is reused";
}

TEST_F(CpuDeviceMemoryLimit, CachedBlocksGoBackBeforeItFails) {
  (void)floats(150'000, device);  // freed at once, kept in the cache
  EXPECT_GT(memory_stats(device).reserved_bytes, 500'000);
  const Tensor other = floats(200'000, device);  // another size: only with the cache emptied
  EXPECT_LE(memory_stats(device).reserved_bytes, kMiB);
}

TEST_F(CpuDeviceMemoryLimit, OtherDevicesHaveTheirOwn) {
  const Tensor here = floats(200'000, device);
  EXPECT_NO_THROW((void)floats(200'000, Device::cpu(2)));
}

TEST(CpuDeviceMemory, NoLimitUnlessOneIsSet) {
  set_cpu_device_memory_limit(0);
  EXPECT_EQ(cpu_device_memory_limit(), 0);
  EXPECT_NO_THROW((void)floats(4 * kMiB, Device::cpu(1)));
  EXPECT_THROW(set_cpu_device_memory_limit(-1), Error);
}

}  // namespace
}  // namespace lockstep
