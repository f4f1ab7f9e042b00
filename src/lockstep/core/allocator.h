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

// CPU devices stand in for GPUs, but draw on the host's memory, where a GPU has its own
// and an allocation past it fails. LOCKSTEP_CPU_DEVICE_MEMORY (bytes, or with a binary
// suffix: 512M, 2GiB) gives each CPU device that much for its tensors, cached blocks
// included as in a GPU's reserved memory: an allocation past it empties the device's cache
// and then fails with OutOfMemoryError, as on a GPU. So a test, or a rehearsal of a GPU's
// memory on a laptop, meets the out-of-memory path a GPU run would. cpu:0 also holds the
// program's host tensors (a dataset in memory), and they count. 0: no limit (the default).
int64_t cpu_device_memory_limit();
// Replaces the variable's value for this process (a test's; 0 lifts the limit).
void set_cpu_device_memory_limit(int64_t bytes);

// Raw device memory. Blocks are 64-byte aligned; size 0 gives nullptr.
void* device_alloc(Device device, size_t bytes);
void device_free(Device device, void* ptr, size_t bytes);

}  // namespace lockstep
