// The GPUs `lockstep run` gives its workers: --gpus auto|LIST, --min-free-memory, waiting
// (with a message) while the GPUs it needs are busy, and the CUDA_VISIBLE_DEVICES every
// worker gets.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/gpu/gpu_leases.h"
#include "lockstep/gpu/nvml.h"

namespace lockstep::tools {

struct GpuAssignment {
  // Empty: the workers run on CPU devices (no GPU on the host), or keep the launcher's
  // CUDA_VISIBLE_DEVICES (no --gpus and more workers than GPUs).
  std::string cuda_visible_devices;
  std::vector<std::string> per_rank;  // "GPU 2 (NVIDIA A100-SXM4-80GB, 79.1 GiB free)"
  std::vector<unsigned> indices;      // their NVML indices, in rank order
  std::string notice;                 // what to tell the user when no GPU is assigned
  // The leases on the assigned GPUs: held while this lives (the job's life).
  std::shared_ptr<gpu::GpuLeases> leases;
};

struct GpuAsk {
  std::string gpus;  // "" (not given), "auto", or "0,2,3"
  int workers = 1;
  uint64_t min_free_bytes = 0;
  double wait_seconds = -1;  // give up after this long; < 0: wait until free
  double poll_seconds = 2;   // between readings while waiting
  std::string holder;        // what the leases record: "pid 12, user ana: lockstep run -n 2 -- ..."
};

// Reads NVML until the GPUs asked for are free and leased to this job (or the wait runs out,
// or `interrupted` becomes true: both are Errors). UsageError for what no wait can fix.
GpuAssignment assign_gpus(const GpuAsk& ask, const volatile bool& interrupted);

// The job's GPUs' utilization while it runs, sampled by the launcher: `--ramp`'s figure for a
// program that prints none of its own. Without GPUs (or NVML) it samples nothing.
class GpuUtilization {
 public:
  explicit GpuUtilization(std::vector<unsigned> indices);
  void sample();                       // one reading of NVML's utilization.gpu per GPU
  std::optional<double> mean() const;  // percent, over the GPUs and the samples

 private:
  std::vector<unsigned> indices_;
  std::unique_ptr<gpu::Nvml> nvml_;
  double sum_ = 0;
  int64_t count_ = 0;
};

}  // namespace lockstep::tools
