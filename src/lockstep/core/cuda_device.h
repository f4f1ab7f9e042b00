// CUDA devices as the rest of the library sees them, without CUDA headers: how many there
// are, which GPU a logical device runs on, waiting for one, and the TF32 switch. In a build
// without the CUDA backend there are none, and asking for one is an error that says so.
//
// Logical devices: cuda:N is GPU N of the visible ones (CUDA_VISIBLE_DEVICES applies), or,
// with LOCKSTEP_CUDA_DEVICES_PER_GPU=K, GPU N / K: K logical devices share each GPU, each
// with its own stream and memory accounting, so multi-device code runs on a one-GPU machine.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <string>

#include "lockstep/core/allocator.h"
#include "lockstep/core/device.h"

namespace lockstep::cuda {

// Whether this build has the CUDA backend.
bool built();
// Logical CUDA devices: visible GPUs x devices per GPU; 0 without the backend, a driver or
// a GPU (never throws).
int device_count();
int devices_per_gpu();
// Why there is no CUDA device ("" when there is one): no backend in this build, or the CUDA
// error that counting the GPUs gave, named and explained ("cudaErrorInsufficientDriver: CUDA
// driver version is insufficient for CUDA runtime version" when the driver is older than
// the runtime), with the driver's and the runtime's CUDA versions and what to do
// (cuda_versions.h), so "no GPU" is never silent.
std::string unavailable_reason();
// LOCKSTEP_REQUIRE_CUDA=1: a machine where CUDA must work (a GPU check), so a test that
// would skip for want of a CUDA device fails instead.
inline bool cuda_required() {
  const char* required = std::getenv("LOCKSTEP_REQUIRE_CUDA");
  return required != nullptr && std::string(required) == "1";
}
// The CUDA runtime's index of the GPU that logical device cuda:N runs on; throws Error
// naming the visible devices when N is out of range.
int physical_device(Device device);
// Waits until all work queued on the device's stream has run; throws on a CUDA error.
void synchronize(Device device);

// TF32 tensor cores for f32 GEMMs: off by default, so f32 results match the CPU's to f32
// rounding; on, GEMMs run several times faster with a 10-bit mantissa for the products.
void set_allow_tf32(bool allow);
bool allow_tf32();

// The caching allocator behind device_alloc for cuda devices (core/cuda/caching_allocator).
void* allocate(Device device, size_t bytes);
void release(Device device, void* ptr, size_t bytes);
MemoryStats memory_stats(Device device);
void reset_peak_memory_stats(Device device);
void empty_cache(Device device);
// LOCKSTEP_CUDA_DEVICE_MEMORY: the bytes each CUDA device may reserve (0: the GPU's own
// memory is the limit); past it an allocation empties the device's cache, then throws
// OutOfMemoryError as a full GPU does (core/device_memory_limit.h). Without the backend
// the value is kept and unused.
int64_t device_memory_limit();
void set_device_memory_limit(int64_t bytes);
// Page-locked host memory (cudaMallocHost): copies between it and a GPU run at the bus's
// speed and never stage through a pageable buffer; what a checkpoint of a GPU run copies
// into. Without the backend, ordinary memory. release_pinned_host gives back either.
void* allocate_pinned_host(size_t bytes);
void release_pinned_host(void* ptr);

}  // namespace lockstep::cuda
