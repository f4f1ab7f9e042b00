// What the GPUs of this host look like at one moment, as NVML reports it: plain values,
// no NVML types, so `lockstep doctor`, `lockstep top` and `lockstep run --gpus` can be
// written and tested against states built by hand as well as ones read from a driver (or
// from the test stand-in library, see tests/gpu/).
//
// Readings an NVML call could not give are empty optionals; the call's name and NVML's
// error text are kept in `GpuDevice::unavailable`, so a tool can say why a column is blank.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::gpu {

// A process holding memory on a GPU. NVML gives host PIDs: inside a container that has its
// own PID namespace, /proc does not know them and `user` / `command` stay empty with
// `in_this_namespace` false (tools say so instead of showing nothing).
struct GpuProcess {
  uint32_t pid = 0;
  std::optional<uint64_t> used_bytes;  // NVML may not know it (e.g. under some vGPU modes)
  bool in_this_namespace = true;
  uint32_t uid = 0;
  std::string user;     // from /proc/<pid>/status and the password database
  std::string command;  // /proc/<pid>/cmdline, arguments joined by spaces
  // Its share of the GPU in NVML's latest sample (nvmlDeviceGetProcessUtilization): percent
  // of the time its kernels ran and its memory was read or written. Empty when NVML has no
  // sample of it (an idle process, or a GPU that does not keep them).
  std::optional<unsigned> sm_utilization, memory_utilization;
};

// NVLink's data-link error counters, summed over a GPU's active links. Replays and CRC
// errors are corrected by resending; a count that grows means a bad link, cable or
// connector, and recoveries (the link retrained) stall traffic.
struct NvlinkErrors {
  unsigned links = 0;  // active links the counters were read on
  uint64_t replay = 0, recovery = 0, crc_flit = 0, crc_data = 0;
  uint64_t total() const { return replay + recovery + crc_flit + crc_data; }
};

// The GPU's registration with the NVSwitch fabric manager (Hopper and later).
enum class FabricState { kNotStarted, kInProgress, kCompleted };

// Throttle ("clocks event") reasons: NVML's bit values.
enum ThrottleReason : uint64_t {
  kThrottleGpuIdle = 0x1,
  kThrottleApplicationsClocksSetting = 0x2,
  kThrottleSwPowerCap = 0x4,
  kThrottleHwSlowdown = 0x8,
  kThrottleSyncBoost = 0x10,
  kThrottleSwThermalSlowdown = 0x20,
  kThrottleHwThermalSlowdown = 0x40,
  kThrottleHwPowerBrakeSlowdown = 0x80,
  kThrottleDisplayClockSetting = 0x100,
};
// "sw_power_cap,hw_thermal_slowdown"; "none" for 0. Bits NVML may add later print as hex.
std::string throttle_reason_names(uint64_t reasons);
// Thermal (sw or hw) or power (sw cap, hw slowdown, power brake) throttling: what alerts.
bool is_thermal_throttle(uint64_t reasons);
bool is_power_throttle(uint64_t reasons);

// GPU Performance Monitoring's activity over the time between two readings (Hopper and
// later; NVML's nvmlGpmMetricsGet), each a fraction in [0, 1], as DCGM's DCGM_FI_PROF_*
// fields give them. A metric the GPU does not count stays empty.
struct GpmActivity {
  std::optional<double> graphics_engine, sm, sm_occupancy, tensor, dram, fp64, fp32, fp16;
};

struct GpuDevice {
  unsigned index = 0;      // NVML's index: PCI bus order
  std::string name;        // "NVIDIA A100-SXM4-80GB"
  std::string uuid;        // "GPU-8c2f…"
  std::string pci_bus_id;  // "00000000:07:00.0"
  int compute_major = 0;   // compute capability, 8.0 for A100
  int compute_minor = 0;
  std::optional<unsigned> multiprocessors;  // SM count, for CUDA's fastest-first order

  // Memory (v2 call: `used` excludes what the driver reserves, as nvidia-smi shows it).
  uint64_t memory_total = 0, memory_reserved = 0, memory_used = 0, memory_free = 0;

  std::optional<unsigned> utilization_gpu;     // percent of the last sample period
  std::optional<unsigned> utilization_memory;  // percent
  std::optional<unsigned> temperature_c;
  std::optional<unsigned> power_mw, power_limit_mw;
  std::optional<unsigned> sm_clock_mhz, sm_clock_max_mhz;
  std::optional<unsigned> memory_clock_mhz;
  std::optional<uint64_t> energy_mj;  // since the driver was loaded (Volta and later)
  // PCIe: the link's generation and lanes now and at most (the lower of the GPU's and the
  // slot's), the GPU's own highest generation, and the traffic of the last 20 ms in KB/s.
  // An idle GPU lowers its link's generation to save power: only the width and the maxima
  // say how the GPU sits in its slot.
  std::optional<unsigned> pcie_generation, pcie_generation_max, pcie_generation_gpu_max;
  std::optional<unsigned> pcie_width, pcie_width_max;
  std::optional<unsigned> pcie_tx_kb_per_s, pcie_rx_kb_per_s;
  std::optional<uint64_t> throttle_reasons;  // ThrottleReason bits
  std::optional<bool> persistence_mode;
  std::optional<bool> ecc_enabled;
  std::optional<uint64_t> ecc_uncorrected_volatile, ecc_corrected_volatile;
  std::optional<unsigned> retired_pages;      // single + double bit, all time
  std::optional<bool> retired_pages_pending;  // a retirement waits for the next reset
  // Row remapping (A100, H100 and later, which retire no pages): rows remapped for
  // correctable and for uncorrectable errors, a remap waiting for the next reset, a remap
  // that failed (the GPU is out of spare rows).
  std::optional<unsigned> remapped_rows_correctable, remapped_rows_uncorrectable;
  std::optional<bool> remap_pending, remap_failed;

  // NVLink: the error counters (empty on a GPU without active links), and whether a link
  // goes to an NVSwitch (a system that needs the fabric manager).
  std::optional<NvlinkErrors> nvlink_errors;
  bool behind_nvswitch = false;
  // With the fabric manager (Hopper and later; empty where NVML has no fabric state): how
  // far the GPU's registration got and, once completed, its outcome ("" for success).
  std::optional<FabricState> fabric_state;
  std::string fabric_error;

  // Only from the second reading of one Nvml on: a metric spans two samples.
  std::optional<GpmActivity> gpm;

  std::vector<GpuProcess> processes;  // compute processes
  // Calls that failed for this device: "nvmlDeviceGetPowerUsage: Not Supported".
  std::vector<std::string> unavailable;
};

// How two GPUs reach each other, as `nvidia-smi topo -m` prints it, best first.
enum class GpuLink {
  kSelf,    // X
  kNvlink,  // NV<n>: n NVLink connections
  kPix,     // one PCIe switch
  kPxb,     // several PCIe switches, no host bridge
  kPhb,     // a PCIe host bridge (the CPU)
  kNode,    // host bridges within one NUMA node
  kSys,     // across NUMA nodes (SMP interconnect)
};
struct GpuPath {
  GpuLink link = GpuLink::kSys;
  unsigned nvlinks = 0;  // for kNvlink
};
std::string to_string(const GpuPath& path);  // "X", "NV12", "PIX", "PXB", "PHB", "NODE", "SYS"

struct GpuState {
  // Which library was loaded (the real driver's libnvidia-ml.so.1, or the stand-in named
  // by LOCKSTEP_NVML_LIBRARY); empty with `load_error` set when none could be.
  std::string library_path;
  std::string load_error;  // "libnvidia-ml.so.1: cannot open shared object file" / "nvmlInit: Driver Not Loaded"
  bool loaded() const { return load_error.empty(); }

  std::string driver_version;   // "535.129.03"
  std::string nvml_version;     // "12.535.129.03"
  int cuda_driver_version = 0;  // the newest CUDA the driver supports: 12020 for 12.2

  std::vector<GpuDevice> devices;              // NVML (PCI bus) order
  std::vector<std::vector<GpuPath>> topology;  // [i][j] by NVML index; empty when not asked for
  std::chrono::system_clock::time_point taken;
};

}  // namespace lockstep::gpu
