// Per-device memory: every tensor's bytes come from its device's allocator, which counts
// what is allocated now, the peak since the last reset, and what it holds reserved
// (allocated plus cached free blocks). memory_stats(device) answers "how much memory does
// my model use", like PyTorch's torch.cuda.memory_stats.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lockstep/core/device.h"

namespace lockstep {

struct MemoryStats {
  int64_t allocated_bytes = 0;  // held by live tensors
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;  // allocated + cached for reuse
  int64_t allocations = 0;     // number of allocations served so far
};

MemoryStats memory_stats(Device device);
void reset_peak_memory_stats(Device device);
// Returns cached free blocks to the system (reserved drops to allocated).
void empty_cache(Device device);

// Raw device memory. Blocks are 64-byte aligned; size 0 gives nullptr.
void* device_alloc(Device device, size_t bytes);
void device_free(Device device, void* ptr, size_t bytes);

}  // namespace lockstep
