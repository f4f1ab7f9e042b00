// A fixed memory budget for each device of one kind, read from an environment variable
// (bytes, or a number with a binary suffix: 512M, 1.5GiB; 0 or unset: none) at its first
// use, or set by the program. CPU devices take it to stand in for a GPU's fixed memory
// (LOCKSTEP_CPU_DEVICE_MEMORY); GPUs to leave the rest of theirs to others or to meet the
// out-of-memory path on purpose (LOCKSTEP_CUDA_DEVICE_MEMORY, as PyTorch's
// set_per_process_memory_fraction). The allocators count it against their reserved bytes.
#pragma once

#include <atomic>
#include <cstdint>

namespace lockstep {

// `text` as bytes (memory_size.h's grammar); an Error naming `variable` when it is not a size.
int64_t parse_memory_size(const char* text, const char* variable);

class DeviceMemoryLimit {
 public:
  explicit constexpr DeviceMemoryLimit(const char* variable) : variable_(variable) {}
  // The budget in bytes, 0 for none.
  int64_t bytes();
  // Replaces the variable's value for this process (0 lifts the limit).
  void set(int64_t bytes);
  const char* variable() const { return variable_; }

 private:
  const char* variable_;
  std::atomic<int64_t> bytes_ = -1;  // -1 until the variable is read
};

}  // namespace lockstep
