// A device memory budget: sizes as the variables take them, read at first use, replaced by
// the program; and on a GPU (LOCKSTEP_CUDA_DEVICE_MEMORY) an allocation past it gives the
// cache back, then throws OutOfMemoryError naming the device and the limit.
#include "lockstep/core/device_memory_limit.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "lockstep/core/allocator.h"
#include "lockstep/core/error.h"
#include "lockstep/core/tensor.h"
#include "testing/devices.h"

namespace lockstep {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(DeviceMemoryLimit, SizesAreBytesOrBinaryMultiples) {
  EXPECT_EQ(parse_memory_size("4096", "V"), 4096);
  EXPECT_EQ(parse_memory_size("512M", "V"), 512 * kMiB);
  EXPECT_EQ(parse_memory_size("1.5GiB", "V"), 1536 * kMiB);
  EXPECT_EQ(parse_memory_size("2kb", "V"), 2048);
  EXPECT_EQ(parse_memory_size("0", "V"), 0);
  for (const char* bad : {"lots", "-1M", "5Q", "", "1e30T"}) {
    try {
      parse_memory_size(bad, "LOCKSTEP_CUDA_DEVICE_MEMORY");
      ADD_FAILURE() << "'" << bad << "' was taken as a size";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("LOCKSTEP_CUDA_DEVICE_MEMORY='") + bad + "' is not a size"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(DeviceMemoryLimit, ReadAtFirstUseThenReplacedByTheProgram) {
  ::setenv("LOCKSTEP_TEST_DEVICE_MEMORY", "3M", 1);
  DeviceMemoryLimit limit("LOCKSTEP_TEST_DEVICE_MEMORY");
  ::setenv("LOCKSTEP_TEST_DEVICE_MEMORY", "5M", 1);  // before the first use: this one counts
  EXPECT_EQ(limit.bytes(), 5 * kMiB);
  ::setenv("LOCKSTEP_TEST_DEVICE_MEMORY", "7M", 1);
  EXPECT_EQ(limit.bytes(), 5 * kMiB) << "read once";
  limit.set(kMiB);
  EXPECT_EQ(limit.bytes(), kMiB);
  EXPECT_THROW(limit.set(-1), Error);
  ::unsetenv("LOCKSTEP_TEST_DEVICE_MEMORY");
  EXPECT_EQ(DeviceMemoryLimit("LOCKSTEP_TEST_DEVICE_MEMORY").bytes(), 0) << "unset: none";
}

TEST(CudaDeviceMemoryLimit, AnAllocationPastItThrowsOutOfMemory) {
  const Device device(DeviceType::cuda, 0);
  LOCKSTEP_SKIP_UNLESS_DEVICE(device);
  empty_cache(device);
  const int64_t held = memory_stats(device).reserved_bytes;
  cuda::set_device_memory_limit(held + 6 * kMiB);
  try {
    Tensor first = Tensor::empty({kMiB}, DType::f32, device);  // 4 MiB
    try {
      (void)Tensor::empty({kMiB}, DType::f32, device);
      ADD_FAILURE() << "4 MiB more fitted beside 4 MiB in use in a limit 6 MiB above what was held";
    } catch (const OutOfMemoryError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("out of memory on cuda:0"), std::string::npos) << message;
      EXPECT_NE(message.find("(LOCKSTEP_CUDA_DEVICE_MEMORY)"), std::string::npos) << message;
    }
    first = Tensor();
    // 6 MiB, a new size: fits only once the cached 4 MiB go back.
    const Tensor whole = Tensor::empty({3 * kMiB / 2}, DType::f32, device);
    EXPECT_LE(memory_stats(device).reserved_bytes, held + 6 * kMiB);
  } catch (...) {
    cuda::set_device_memory_limit(0);
    throw;
  }
  cuda::set_device_memory_limit(0);
}

}  // namespace
}  // namespace lockstep
