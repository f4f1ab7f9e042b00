// Leases on GPUs, so two jobs never share one by accident: `lockstep run --gpus auto` takes
// a lease on each GPU it picks — an exclusive flock on a file per GPU (by UUID) in a
// directory every user can use — and holds it for the job's life. Two launches at the same
// moment get disjoint GPUs; a lease whose holder is gone (exited, killed) is released by the
// kernel and taken over; what holds a lease is written in its file for the others to show.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/gpu/gpu_state.h"

namespace lockstep::gpu {

// LOCKSTEP_GPU_LEASE_DIR, or /tmp/lockstep-gpu-leases (made world-writable and sticky, as
// /tmp is).
std::string lease_directory();

// Leases this process holds; released when it goes (or the process ends).
class GpuLeases {
 public:
  explicit GpuLeases(std::string directory = lease_directory());
  ~GpuLeases();
  GpuLeases(const GpuLeases&) = delete;
  GpuLeases& operator=(const GpuLeases&) = delete;

  // Takes the lease on every GPU of `uuids`, recording `holder` ("pid 123, user ana: lockstep
  // run -n 2 -- python train.py"), or none of them: false when another process holds one.
  bool take_all(const std::vector<std::string>& uuids, const std::string& holder);
  void release_all();

  // What holds each GPU of `state` that another process leases, by NVML index.
  std::map<unsigned, std::string> held_elsewhere(const GpuState& state) const;

 private:
  std::string path_of(const std::string& uuid) const;
  std::string directory_;
  std::vector<int> fds_;  // one per lease held
};

// The same for a program that only shows leases (top, doctor): none when this host has no
// lease directory and none can be made, as then no job leases through it either.
std::map<unsigned, std::string> leased_gpus(const GpuState& state);

}  // namespace lockstep::gpu
