// cuda_device.h in builds without the CUDA backend: no devices, and a clear error for any
// use of one. (With the backend, core/cuda/ implements these.)
#include "lockstep/core/cuda_device.h"

#if !LOCKSTEP_HAVE_CUDA

#include <cstdlib>

#include "lockstep/core/error.h"

namespace lockstep::cuda {
namespace {

[[noreturn]] void unavailable(Device device) {
  LOCKSTEP_FAIL() << "device " << device
                  << " is not available: this build of Lockstep has no CUDA backend (it is built when nvcc and NCCL "
                     "are found; see the README)";
  std::abort();  // unreachable
}

}  // namespace

bool built() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() {
  return "this build of Lockstep has no CUDA backend (it is built when nvcc and NCCL are found)";
}
int devices_per_gpu() { return 1; }
int physical_device(Device device) { unavailable(device); }
void synchronize(Device device) { unavailable(device); }
void set_allow_tf32(bool) {}
bool allow_tf32() { return false; }
void* allocate(Device device, size_t) { unavailable(device); }
void release(Device, void*, size_t) {}
MemoryStats memory_stats(Device device) { unavailable(device); }
void reset_peak_memory_stats(Device device) { unavailable(device); }
void empty_cache(Device device) { unavailable(device); }
void* allocate_pinned_host(size_t bytes) {
  void* ptr = std::malloc(bytes == 0 ? 1 : bytes);
  LOCKSTEP_CHECK(ptr != nullptr) << "cannot allocate " << bytes << " bytes of host memory";
  return ptr;
}
void release_pinned_host(void* ptr) { std::free(ptr); }

}  // namespace lockstep::cuda

#endif
