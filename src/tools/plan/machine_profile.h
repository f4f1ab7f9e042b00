// The machine a plan is made for: how many devices, the memory of each, the rate their
// GEMMs reach per precision and the bandwidth of the collectives between them. Named
// profiles hold published figures (each says where they come from); `this-host` is
// measured here on CPU devices; a `lockstep doctor --json` file from another server gives
// its GPUs' count, model and memory, the rates coming from the named profile of that model.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/gpu/gpu_state.h"

namespace lockstep::tools {

struct MachineProfile {
  std::string name;
  std::string description;   // "8x A100 80 GB SXM, NVLink 3 through NVSwitch"
  std::string source;        // where the figures come from
  bool cpu_devices = false;  // CPU devices: they share the host's memory and cores
  int devices = 1;
  double memory_bytes = 0;  // per device (CPU devices: the host's memory over the devices)
  // Dense GEMM rates per device, FLOP/s, as reached by training (the peak times the
  // fraction a well-fed transformer step reaches: `achieved_fraction` says how much).
  double fp32_flops = 0, bf16_flops = 0, f16_flops = 0;
  double achieved_fraction = 1;
  // nccl-tests' all-reduce bus bandwidth (bytes/s) over all devices, and the time of a
  // collective too small for the bandwidth to matter.
  double bus_bandwidth = 0;
  double collective_latency_seconds = 0;
  // A device's memory bandwidth (bytes/s): what the optimizer's step runs at.
  double memory_bandwidth = 0;
  // What starting a kernel costs the GPU's stream (host-bound for small ones): small
  // micro-batches pay it more often.
  double kernel_launch_seconds = 0;
  // CPU devices: the share of a core each of a device's threads gets (1 unless the devices'
  // threads outnumber the cores), and the threads a device runs.
  double core_share = 1;
  int threads_per_device = 1;

  // The rate a GEMM in `precision` ("f32", "bf16", "f16") reaches; 0 when the devices
  // have no such units (bf16 before Ampere).
  double flops(const std::string& precision) const;
};

std::vector<std::string> machine_profile_names();
// One of machine_profile_names(); a UsageError lists them.
MachineProfile named_machine_profile(const std::string& name);
// The GPUs of a `lockstep doctor --json` report: their count, memory and the model's rates
// (a model no profile covers is a UsageError that names it and the profiles there are).
MachineProfile machine_profile_from_doctor(const nlohmann::json& report, const std::string& path);
// This host as `devices` CPU devices: memory from /proc/meminfo, the GEMM rate measured on
// one device's share of the cores, the collectives' bandwidth from a measured copy.
MachineProfile this_host_profile(int devices);
// This host's GPUs as NVML reads them (`state`), `devices` of them: each with the memory of
// the smallest GPU NVML lists (or LOCKSTEP_CUDA_DEVICE_MEMORY's cap, where it is lower), the
// rates from the named profile of that model. An Error when NVML lists no GPU; a
// UsageError, as for a doctor report, when no profile knows the model.
MachineProfile this_host_gpu_profile(const gpu::GpuState& state, int devices);

}  // namespace lockstep::tools
