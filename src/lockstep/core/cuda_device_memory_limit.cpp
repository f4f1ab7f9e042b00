// LOCKSTEP_CUDA_DEVICE_MEMORY (cuda_device.h), in every build: the caching allocator
// (core/cuda/) reads it where the backend is built.
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/device_memory_limit.h"

namespace lockstep::cuda {
namespace {

DeviceMemoryLimit& limit() {
  static DeviceMemoryLimit value("LOCKSTEP_CUDA_DEVICE_MEMORY");
  return value;
}

}  // namespace

int64_t device_memory_limit() { return limit().bytes(); }

void set_device_memory_limit(int64_t bytes) { limit().set(bytes); }

}  // namespace lockstep::cuda
