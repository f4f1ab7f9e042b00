// Hand-built GPU states for top's tests: two A100s running one job, readings written out
// as a person would read them off nvidia-smi.
#pragma once

#include <string>

#include "tools/top/top_sample.h"

namespace lockstep::top_testing {

using tools::TopSample;

constexpr uint64_t kMiB = 1024 * 1024;

inline gpu::GpuDevice a100(unsigned index, unsigned utilization, uint64_t used_mib) {
  gpu::GpuDevice d;
  d.index = index;
  d.name = "NVIDIA A100-SXM4-80GB";
  d.uuid = "GPU-0000000" + std::to_string(index);
  d.pci_bus_id = "00000000:0" + std::to_string(index + 7) + ":00.0";
  d.memory_total = 81920 * kMiB;
  d.memory_reserved = 512 * kMiB;
  d.memory_used = used_mib * kMiB;
  d.memory_free = d.memory_total - d.memory_reserved - d.memory_used;
  d.utilization_gpu = utilization;
  d.utilization_memory = 45;
  d.temperature_c = 64;
  d.power_mw = 312400;
  d.power_limit_mw = 400000;
  d.sm_clock_mhz = 1410;
  d.memory_clock_mhz = 1593;
  d.energy_mj = 912345678;
  d.pcie_generation = d.pcie_generation_max = d.pcie_generation_gpu_max = 4;
  d.pcie_width = d.pcie_width_max = 16;
  d.pcie_tx_kb_per_s = 1500;
  d.pcie_rx_kb_per_s = 250000;
  d.nvlink_errors = gpu::NvlinkErrors{12, 3, 0, 41, 0};
  d.behind_nvswitch = true;
  d.throttle_reasons = 0;
  return d;
}

inline gpu::GpuProcess process(uint32_t pid, const std::string& user, const std::string& command, uint64_t mib) {
  gpu::GpuProcess p;
  p.pid = pid;
  p.user = user;
  p.uid = 1000;
  p.command = command;
  p.used_bytes = mib * kMiB;
  return p;
}

// Two GPUs, one job ("python train.py" by alice) on both, and on GPU 1 a process from
// another PID namespace.
inline TopSample two_gpu_sample() {
  TopSample sample;
  sample.taken = std::chrono::system_clock::time_point(std::chrono::milliseconds(1714564800123));
  sample.gpus.library_path = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";
  sample.gpus.driver_version = "535.129.03";
  sample.gpus.cuda_driver_version = 12020;
  sample.gpus.devices = {a100(0, 97, 71234), a100(1, 91, 70000)};
  sample.gpus.devices[0].processes = {process(12345, "alice", "python train.py", 70000)};
  sample.gpus.devices[1].processes = {process(12346, "alice", "python train.py", 69000)};
  gpu::GpuProcess hidden;
  hidden.pid = 4242;
  hidden.in_this_namespace = false;
  hidden.used_bytes = 1000 * kMiB;
  sample.gpus.devices[1].processes.push_back(hidden);
  sample.cuda_index = {1, 0};
  return sample;
}

inline TopSample cpu_sample() {
  TopSample sample;
  sample.taken = std::chrono::system_clock::time_point(std::chrono::milliseconds(1714564800123));
  sample.gpus.load_error = "cannot open shared object file: No such file or directory";
  sample.nvml_library_tried = "/nonexistent/libnvidia-ml.so.1";
  sample.cpu.core_utilization = {12.5, 100.0};
  sample.cpu.memory.total = 16384 * kMiB;
  sample.cpu.memory.available = 4096 * kMiB;
  return sample;
}

}  // namespace lockstep::top_testing
