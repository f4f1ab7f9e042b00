// Which GPUs a job gets: `lockstep run --gpus auto|0,2,3 --min-free-memory 10G`.
//
// `auto` takes the GPUs with the most free memory, then the least utilization, among those
// no other user holds (a process of another uid, or one outside this PID namespace, whose
// owner cannot be known); the chosen GPUs are then ranked in NVML (PCI bus) order so that
// neighbouring ranks sit on neighbouring GPUs. A list names NVML indices, as nvidia-smi
// shows them. Either way a GPU with less free memory than asked is not ready yet: the
// caller waits and asks again, and `waiting_for` says what it waits for.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/gpu/gpu_state.h"

namespace lockstep::gpu {

struct GpuRequest {
  int count = 1;                                 // one GPU per worker
  std::optional<std::vector<unsigned>> indices;  // --gpus 0,2,3; empty optional for auto
  uint64_t min_free_bytes = 0;
  uint32_t uid = 0;  // ours: our own processes do not make a GPU busy
  // NVML indices the launcher may use (its CUDA_VISIBLE_DEVICES resolved); empty optional: all.
  std::optional<std::vector<unsigned>> allowed;
  // GPUs another job leases (gpu_leases.h), by NVML index, with what holds them: busy.
  std::map<unsigned, std::string> leased = {};
};

struct GpuSelection {
  std::vector<unsigned> chosen;  // NVML indices, one per worker; empty while waiting
  std::string waiting_for;       // why not yet, naming each GPU that blocks
};

// Throws UsageError for a request no wait can satisfy: an index that does not exist or is
// not allowed, a repeated index, a list whose length is not `count`, more GPUs than the
// host (or CUDA_VISIBLE_DEVICES) has.
GpuSelection select_gpus(const GpuState& state, const GpuRequest& request);

// "0,2,3" → {0, 2, 3}; UsageError naming the bad entry.
std::vector<unsigned> parse_gpu_list(const std::string& text);

// Memory held on `device` by processes that are not ours (another uid, or not visible).
uint64_t foreign_bytes(const GpuDevice& device, uint32_t uid);
// Someone else's process is on it.
bool held_by_others(const GpuDevice& device, uint32_t uid);

}  // namespace lockstep::gpu
