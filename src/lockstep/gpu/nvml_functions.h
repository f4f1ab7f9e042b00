// The NVML entry points Lockstep calls, looked up in a dlopen'ed library. Where NVML has
// versioned names, each is a list newest first: a driver that lacks a name (or answers
// NVML_ERROR_FUNCTION_NOT_FOUND) is asked the next one, as nvtop does. Anything may be
// missing except what `missing_required` names.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lockstep/gpu/nvml_abi.h"

namespace lockstep::gpu {

// A function pointer with the name it was found under (for messages).
template <typename Fn>
struct NvmlEntry {
  Fn fn = nullptr;
  const char* name = "";
  explicit operator bool() const { return fn != nullptr; }
};
// Newest first; only the names the library exports.
template <typename Fn>
using NvmlVersions = std::vector<NvmlEntry<Fn>>;

struct NvmlFunctions {
  NvmlVersions<nvmlInit_fn> init;
  NvmlEntry<nvmlShutdown_fn> shutdown;
  NvmlEntry<nvmlErrorString_fn> error_string;

  NvmlEntry<nvmlSystemGetString_fn> driver_version, nvml_version;
  NvmlVersions<nvmlSystemGetCudaDriverVersion_fn> cuda_driver_version;

  NvmlVersions<nvmlDeviceGetCount_fn> device_count;
  NvmlVersions<nvmlDeviceGetHandleByIndex_fn> handle_by_index;

  NvmlEntry<nvmlDeviceGetString_fn> name, uuid;
  NvmlVersions<nvmlDeviceGetPciInfo_fn> pci_info;
  NvmlEntry<nvmlDeviceGetCudaComputeCapability_fn> compute_capability;
  NvmlEntry<nvmlDeviceGetUint_fn> gpu_cores;
  NvmlEntry<nvmlDeviceGetMemoryInfo_v2_fn> memory_v2;
  NvmlEntry<nvmlDeviceGetMemoryInfo_fn> memory_v1;
  NvmlEntry<nvmlDeviceGetUtilizationRates_fn> utilization;
  NvmlEntry<nvmlDeviceGetTemperature_fn> temperature;
  NvmlEntry<nvmlDeviceGetUint_fn> power_usage, power_limit;
  NvmlEntry<nvmlDeviceGetClockInfo_fn> clock, max_clock;
  NvmlVersions<nvmlDeviceGetClocksReasons_fn> clocks_reasons;  // "event" (R535+), then "throttle"
  NvmlEntry<nvmlDeviceGetTotalEnergyConsumption_fn> energy;
  // The link's generation and width now and at most (the GPU's and the slot's lower), and
  // the GPU's own highest generation.
  NvmlEntry<nvmlDeviceGetUint_fn> pcie_generation, pcie_generation_max, pcie_generation_gpu_max;
  NvmlEntry<nvmlDeviceGetUint_fn> pcie_width, pcie_width_max;
  NvmlEntry<nvmlDeviceGetPcieThroughput_fn> pcie_throughput;
  NvmlEntry<nvmlDeviceGetEnableState_fn> persistence_mode;
  NvmlEntry<nvmlDeviceGetEccMode_fn> ecc_mode;
  NvmlEntry<nvmlDeviceGetTotalEccErrors_fn> ecc_errors;
  NvmlEntry<nvmlDeviceGetRetiredPages_fn> retired_pages;
  NvmlEntry<nvmlDeviceGetEnableState_fn> retired_pages_pending;
  NvmlEntry<nvmlDeviceGetRemappedRows_fn> remapped_rows;
  NvmlVersions<nvmlDeviceGetProcesses_fn> processes;  // _v3, _v2 (nvmlProcessInfo_t)
  NvmlEntry<nvmlDeviceGetProcesses_v1_fn> processes_v1;
  NvmlEntry<nvmlDeviceGetProcessUtilization_fn> process_utilization;
  NvmlEntry<nvmlDeviceGetGpuFabricInfo_fn> fabric_info;

  NvmlEntry<nvmlDeviceGetNvLinkState_fn> nvlink_state;
  NvmlVersions<nvmlDeviceGetNvLinkRemotePciInfo_fn> nvlink_remote_pci;
  NvmlEntry<nvmlDeviceGetNvLinkRemoteDeviceType_fn> nvlink_remote_type;
  NvmlEntry<nvmlDeviceGetNvLinkErrorCounter_fn> nvlink_errors;
  NvmlEntry<nvmlDeviceGetTopologyCommonAncestor_fn> common_ancestor;

  NvmlEntry<nvmlGpmQueryDeviceSupport_fn> gpm_support;
  NvmlEntry<nvmlGpmSampleAlloc_fn> gpm_sample_alloc;
  NvmlEntry<nvmlGpmSampleFree_fn> gpm_sample_free;
  NvmlEntry<nvmlGpmSampleGet_fn> gpm_sample_get;
  NvmlEntry<nvmlGpmMetricsGet_fn> gpm_metrics_get;

  // Looks every name up in `library` (a dlopen handle).
  static NvmlFunctions resolve(void* library);
  // "nvmlInit, nvmlDeviceGetCount": what a library must export to be NVML; empty when all are there.
  std::string missing_required() const;
  // NVML's text for a return code ("Not Supported"), or "NVML error <code>" without nvmlErrorString.
  std::string error_text(nvmlReturn_t code) const;
};

// The return codes after which the next older version of a call is tried.
inline bool try_older_version(nvmlReturn_t code) {
  return code == NVML_ERROR_FUNCTION_NOT_FOUND || code == NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
}

// Calls the newest version of `versions` that the driver answers; `used` names it. With no
// version exported at all, returns NVML_ERROR_FUNCTION_NOT_FOUND and `used` is `fallback_name`.
template <typename Fn, typename... Args>
nvmlReturn_t call_newest(const NvmlVersions<Fn>& versions, const char* fallback_name, const char*& used,
                         Args&&... args) {
  used = fallback_name;
  nvmlReturn_t code = NVML_ERROR_FUNCTION_NOT_FOUND;
  for (const auto& entry : versions) {
    used = entry.name;
    code = entry.fn(std::forward<Args>(args)...);
    if (!try_older_version(code)) return code;
  }
  return code;
}

}  // namespace lockstep::gpu
