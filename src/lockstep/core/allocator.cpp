#include "lockstep/core/allocator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "lockstep/core/cuda_device.h"
#include "lockstep/core/device_memory_limit.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// A training step allocates the same sizes every step; caching freed blocks by exact
// (rounded) size turns most allocations into a map lookup and avoids the page faults of
// fresh mmap'd memory. Small blocks round to 64 bytes, large ones to 4 KiB.
size_t round_size(size_t bytes) {
  const size_t unit = bytes < (1u << 16) ? 64 : 4096;
  return (bytes + unit - 1) / unit * unit;
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}
std::string mib(size_t bytes) { return mib(static_cast<int64_t>(bytes)); }

// "MemAvailable 812.3 MiB" from /proc/meminfo, or what is unknown.
std::string available_memory() {
  if (FILE* file = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kib = -1;
    while (std::fgets(line, sizeof(line), file)) {
      if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
    }
    std::fclose(file);
    if (kib >= 0) return "the host has " + mib(static_cast<int64_t>(kib) * 1024) + " available";
  }
  return "the host's available memory is unknown";
}

DeviceMemoryLimit& cpu_limit() {
  static DeviceMemoryLimit limit("LOCKSTEP_CPU_DEVICE_MEMORY");
  return limit;
}

struct CpuPool {
  std::mutex mutex;
  MemoryStats stats;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // rounded size -> blocks

  void* allocate(int index, size_t bytes) {
    const size_t size = round_size(bytes);
    std::lock_guard<std::mutex> lock(mutex);
    void* ptr = nullptr;
    auto it = free_blocks.find(size);
    if (it != free_blocks.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
    } else {
      check_limit(index, size);
      ptr = std::aligned_alloc(64, size);
      if (ptr == nullptr) {
        // The cache's blocks of other sizes go back first, as PyTorch empties its cache.
        const int64_t cached = release_cached();
        ptr = std::aligned_alloc(64, size);
        if (ptr == nullptr) {
          std::ostringstream message;
          message << "out of host memory: " << mib(size) << " asked, " << mib(stats.allocated_bytes)
                  << " in use by tensors (" << mib(cached) << " of cached blocks given back first); "
                  << available_memory() << ": use a smaller model, batch or micro-batch";
          throw OutOfMemoryError(message.str());
        }
      }
      stats.reserved_bytes += static_cast<int64_t>(size);
    }
    stats.allocated_bytes += static_cast<int64_t>(size);
    stats.allocations += 1;
    if (stats.allocated_bytes > stats.peak_allocated_bytes) stats.peak_allocated_bytes = stats.allocated_bytes;
    return ptr;
  }

  // A new block of `size` must keep the reserved bytes within the device's limit: the
  // cached blocks go back first, as a GPU's allocator empties its cache before it fails.
  void check_limit(int index, size_t size) {
    const int64_t limit = cpu_device_memory_limit();
    if (limit == 0 || stats.reserved_bytes + static_cast<int64_t>(size) <= limit) return;
    const int64_t cached = release_cached();
    if (stats.reserved_bytes + static_cast<int64_t>(size) <= limit) return;
    std::ostringstream message;
    message << "out of memory on cpu:" << index << ": tried to allocate " << mib(size) << "; the device has "
            << mib(limit) << " in all (LOCKSTEP_CPU_DEVICE_MEMORY), " << mib(stats.allocated_bytes)
            << " held by tensors (" << mib(cached)
            << " of cached blocks given back first): use a smaller micro-batch, or spread the model over more devices";
    throw OutOfMemoryError(message.str());
  }

  // Called from Storage's noexcept destructor: it must not throw, so a block the cache
  // has no room to remember (its bookkeeping cannot allocate) goes back to the system.
  void release(void* ptr, size_t bytes) noexcept {
    const size_t size = round_size(bytes);
    std::lock_guard<std::mutex> lock(mutex);
    stats.allocated_bytes -= static_cast<int64_t>(size);
    try {
      free_blocks[size].push_back(ptr);
    } catch (...) {
      std::free(ptr);
      stats.reserved_bytes -= static_cast<int64_t>(size);
    }
  }

  void empty() {
    std::lock_guard<std::mutex> lock(mutex);
    release_cached();
  }

  // Frees every cached block (the caller holds the mutex); the bytes freed.
  int64_t release_cached() {
    int64_t freed = 0;
    for (auto& [size, blocks] : free_blocks) {
      for (void* p : blocks) std::free(p);
      freed += static_cast<int64_t>(size * blocks.size());
    }
    stats.reserved_bytes -= freed;
    free_blocks.clear();
    return freed;
  }
};

// One pool per logical CPU device. Pools live for the whole process (tensors may be freed
// during static destruction), so they are never destroyed.
CpuPool& cpu_pool(int index) {
  static std::mutex mutex;
  static auto* pools = new std::map<int, CpuPool*>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& pool = (*pools)[index];
  if (pool == nullptr) pool = new CpuPool();
  return *pool;
}

}  // namespace

void* device_alloc(Device device, size_t bytes) {
  if (device.is_cuda()) return bytes == 0 ? nullptr : cuda::allocate(device, bytes);
  if (bytes == 0) return nullptr;
  void* ptr = cpu_pool(device.index()).allocate(device.index(), bytes);
#ifndef NDEBUG
  // Debug builds (the sanitizer presets) hand out every block filled with 0xFF bytes: NaN
  // as a float or a double, -1 as an integer. A reused block would otherwise still hold its
  // last user's values, often the very values a kernel that leaves part of its output
  // unwritten should have written, and its tests would pass.
  std::memset(ptr, 0xFF, bytes);
#endif
  return ptr;
}

void device_free(Device device, void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  if (device.is_cuda()) {
    cuda::release(device, ptr, bytes);
  } else {
    cpu_pool(device.index()).release(ptr, bytes);
  }
}

int64_t cpu_device_memory_limit() { return cpu_limit().bytes(); }

void set_cpu_device_memory_limit(int64_t bytes) { cpu_limit().set(bytes); }

MemoryStats memory_stats(Device device) {
  if (device.is_cuda()) return cuda::memory_stats(device);
  CpuPool& pool = cpu_pool(device.index());
  std::lock_guard<std::mutex> lock(pool.mutex);
  return pool.stats;
}

void reset_peak_memory_stats(Device device) {
  if (device.is_cuda()) return cuda::reset_peak_memory_stats(device);
  CpuPool& pool = cpu_pool(device.index());
  std::lock_guard<std::mutex> lock(pool.mutex);
  pool.stats.peak_allocated_bytes = pool.stats.allocated_bytes;
}

void empty_cache(Device device) {
  if (device.is_cuda()) return cuda::empty_cache(device);
  cpu_pool(device.index()).empty();
}

}  // namespace lockstep
