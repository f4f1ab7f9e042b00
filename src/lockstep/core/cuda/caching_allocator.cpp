// The cuda:N allocator: cudaMalloc is slow and synchronizes the GPU, so freed blocks are
// kept by size and handed out again, as PyTorch's caching allocator does. A block freed
// by a tensor on logical device N is reused only for that device, whose ops all run on one
// stream: work queued after the reuse runs after the work that last used the block, so no
// event is needed. Sizes round up to 512 bytes below 1 MiB and to 2 MiB above, which keeps
// the number of distinct sizes (and so the cache) small for a training step's shapes.
// LOCKSTEP_CUDA_DEVICE_MEMORY caps each device's reserved bytes (device_memory_limit.h).
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/core/cuda/runtime.h"
#include "lockstep/core/error.h"

namespace lockstep::cuda {
namespace {

size_t round_size(size_t bytes) {
  const size_t unit = bytes < (size_t{1} << 20) ? 512 : (size_t{2} << 20);
  return (bytes + unit - 1) / unit * unit;
}

std::string mib(int64_t bytes) { return std::to_string(bytes / (1 << 20)) + " MiB"; }

struct Pool {
  std::mutex mutex;
  MemoryStats stats;
  std::map<size_t, std::vector<void*>> free_blocks;  // rounded size -> cached blocks

  // With the mutex held: gives every cached block back to CUDA. cudaFree waits for every
  // stream of the GPU, so the nccl backend's calls in flight there drain first and new ones
  // wait (without_communication): an NCCL kernel waiting for a peer that waits for this
  // process would otherwise never let the free return.
  void free_cached(Device device, const char* what) {
    if (free_blocks.empty()) return;
    DeviceScope scope(device);
    synchronize(device);  // cudaFree waits for the GPU anyway; this makes the order explicit
    without_communication(physical_device(device), what, [&] {
      for (auto& [size, blocks] : free_blocks) {
        for (void* p : blocks) cudaFree(p);
        stats.reserved_bytes -= static_cast<int64_t>(size * blocks.size());
      }
      free_blocks.clear();
    });
  }
};

Pool& pool(Device device) {
  static std::mutex mutex;
  static auto* pools = new std::map<int, Pool*>();  // never freed: tensors outlive statics
  std::lock_guard<std::mutex> lock(mutex);
  Pool*& p = (*pools)[device.index()];
  if (p == nullptr) p = new Pool();
  return *p;
}

}  // namespace

void* allocate(Device device, size_t bytes) {
  physical_device(device);  // a clear error for a device that does not exist
  const size_t size = round_size(bytes);
  Pool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  void* ptr = nullptr;
  auto it = p.free_blocks.find(size);
  if (it != p.free_blocks.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
  } else {
    DeviceScope scope(device);
    if (const int64_t limit = device_memory_limit();
        limit > 0 && p.stats.reserved_bytes + static_cast<int64_t>(size) > limit) {
      p.free_cached(device, "emptying the CUDA cache at the device's memory limit");
      if (p.stats.reserved_bytes + static_cast<int64_t>(size) > limit) {
        std::ostringstream message;
        message << "out of memory on " << device << ": tried to allocate " << mib(static_cast<int64_t>(size))
                << "; the device may use " << mib(limit) << " (LOCKSTEP_CUDA_DEVICE_MEMORY), and Lockstep holds "
                << mib(p.stats.allocated_bytes)
                << " in tensors on it: use a smaller micro-batch, spread the model over more devices, or raise the "
                   "limit";
        throw OutOfMemoryError(message.str());
      }
    }
    cudaError_t rc = cudaMalloc(&ptr, size);
    if (rc == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      p.free_cached(device, "emptying the CUDA cache after an out-of-memory error");  // it may hold enough
      rc = cudaMalloc(&ptr, size);
    }
    if (rc == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      std::ostringstream message;
      message << "out of memory on " << device << ": tried to allocate " << mib(static_cast<int64_t>(size))
              << "; the GPU has " << mib(static_cast<int64_t>(total_bytes)) << " in all, "
              << mib(static_cast<int64_t>(free_bytes)) << " free; Lockstep holds " << mib(p.stats.allocated_bytes)
              << " in tensors on this device: use a smaller micro-batch, or spread the model over more devices";
      throw OutOfMemoryError(message.str());
    }
    LOCKSTEP_CUDA_CHECK(rc);
    p.stats.reserved_bytes += static_cast<int64_t>(size);
  }
  p.stats.allocated_bytes += static_cast<int64_t>(size);
  p.stats.allocations += 1;
  if (p.stats.allocated_bytes > p.stats.peak_allocated_bytes) p.stats.peak_allocated_bytes = p.stats.allocated_bytes;
  return ptr;
}

void release(Device device, void* ptr, size_t bytes) {
  const size_t size = round_size(bytes);
  Pool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  p.stats.allocated_bytes -= static_cast<int64_t>(size);
  p.free_blocks[size].push_back(ptr);
}

MemoryStats memory_stats(Device device) {
  physical_device(device);
  Pool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.stats;
}

void reset_peak_memory_stats(Device device) {
  physical_device(device);
  Pool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  p.stats.peak_allocated_bytes = p.stats.allocated_bytes;
}

void* allocate_pinned_host(size_t bytes) {
  void* ptr = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaMallocHost(&ptr, bytes == 0 ? 1 : bytes));
  return ptr;
}

void release_pinned_host(void* ptr) {
  if (ptr != nullptr) cudaFreeHost(ptr);  // from a destructor: an error here has nowhere to go
}

void empty_cache(Device device) {
  physical_device(device);
  Pool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  p.free_cached(device, "empty_cache");
}

}  // namespace lockstep::cuda
