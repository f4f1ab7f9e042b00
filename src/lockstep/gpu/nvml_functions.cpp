#include "lockstep/gpu/nvml_functions.h"

#include <dlfcn.h>

#include <initializer_list>

namespace lockstep::gpu {

namespace {

template <typename Fn>
NvmlEntry<Fn> find(void* library, const char* name) {
  NvmlEntry<Fn> entry;
  entry.fn = reinterpret_cast<Fn>(dlsym(library, name));
  entry.name = name;
  return entry;
}

template <typename Fn>
NvmlVersions<Fn> find_versions(void* library, std::initializer_list<const char*> newest_first) {
  NvmlVersions<Fn> versions;
  for (const char* name : newest_first) {
    if (auto entry = find<Fn>(library, name)) versions.push_back(entry);
  }
  return versions;
}

}  // namespace

NvmlFunctions NvmlFunctions::resolve(void* library) {
  NvmlFunctions f;
  f.init = find_versions<nvmlInit_fn>(library, {"nvmlInit_v2", "nvmlInit"});
  f.shutdown = find<nvmlShutdown_fn>(library, "nvmlShutdown");
  f.error_string = find<nvmlErrorString_fn>(library, "nvmlErrorString");

  f.driver_version = find<nvmlSystemGetString_fn>(library, "nvmlSystemGetDriverVersion");
  f.nvml_version = find<nvmlSystemGetString_fn>(library, "nvmlSystemGetNVMLVersion");
  f.cuda_driver_version = find_versions<nvmlSystemGetCudaDriverVersion_fn>(
      library, {"nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"});

  f.device_count = find_versions<nvmlDeviceGetCount_fn>(library, {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"});
  f.handle_by_index = find_versions<nvmlDeviceGetHandleByIndex_fn>(
      library, {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});

  f.name = find<nvmlDeviceGetString_fn>(library, "nvmlDeviceGetName");
  f.uuid = find<nvmlDeviceGetString_fn>(library, "nvmlDeviceGetUUID");
  // The unversioned nvmlDeviceGetPciInfo fills an older, shorter struct: not used.
  f.pci_info = find_versions<nvmlDeviceGetPciInfo_fn>(library, {"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"});
  f.compute_capability = find<nvmlDeviceGetCudaComputeCapability_fn>(library, "nvmlDeviceGetCudaComputeCapability");
  f.gpu_cores = find<nvmlDeviceGetUint_fn>(library, "nvmlDeviceGetNumGpuCores");
  f.memory_v2 = find<nvmlDeviceGetMemoryInfo_v2_fn>(library, "nvmlDeviceGetMemoryInfo_v2");
  f.memory_v1 = find<nvmlDeviceGetMemoryInfo_fn>(library, "nvmlDeviceGetMemoryInfo");
  f.utilization = find<nvmlDeviceGetUtilizationRates_fn>(library, "nvmlDeviceGetUtilizationRates");
  f.temperature = find<nvmlDeviceGetTemperature_fn>(library, "nvmlDeviceGetTemperature");
  f.power_usage = find<nvmlDeviceGetUint_fn>(library, "nvmlDeviceGetPowerUsage");
  f.power_limit = find<nvmlDeviceGetUint_fn>(library, "nvmlDeviceGetEnforcedPowerLimit");
  f.clock = find<nvmlDeviceGetClockInfo_fn>(library, "nvmlDeviceGetClockInfo");
  f.max_clock = find<nvmlDeviceGetClockInfo_fn>(library, "nvmlDeviceGetMaxClockInfo");
  f.clocks_reasons = find_versions<nvmlDeviceGetClocksReasons_fn>(
      library, {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"});
  f.energy = find<nvmlDeviceGetTotalEnergyConsumption_fn>(library, "nvmlDeviceGetTotalEnergyConsumption");
  f.pcie_generation = find<nvmlDeviceGetUint_fn>(library, "nvmlDeviceGetCurrPcieLinkGeneration");
  f.pcie_generation_max = find<nvmlDeviceGetUint_fn>(library, "nvmlDeviceGetMaxPcieLinkGeneration");
  f.pcie_generation_gpu_max = find<nvmlDeviceGetUint_fn>(library, "nvmlDeviceGetGpuMaxPcieLinkGeneration");
  f.pcie_width = find<nvmlDeviceGetUint_fn>(library, "nvmlDeviceGetCurrPcieLinkWidth");
  f.pcie_width_max = find<nvmlDeviceGetUint_fn>(library, "nvmlDeviceGetMaxPcieLinkWidth");
  f.pcie_throughput = find<nvmlDeviceGetPcieThroughput_fn>(library, "nvmlDeviceGetPcieThroughput");
  f.persistence_mode = find<nvmlDeviceGetEnableState_fn>(library, "nvmlDeviceGetPersistenceMode");
  f.ecc_mode = find<nvmlDeviceGetEccMode_fn>(library, "nvmlDeviceGetEccMode");
  f.ecc_errors = find<nvmlDeviceGetTotalEccErrors_fn>(library, "nvmlDeviceGetTotalEccErrors");
  f.retired_pages = find<nvmlDeviceGetRetiredPages_fn>(library, "nvmlDeviceGetRetiredPages");
  f.retired_pages_pending = find<nvmlDeviceGetEnableState_fn>(library, "nvmlDeviceGetRetiredPagesPendingStatus");
  f.remapped_rows = find<nvmlDeviceGetRemappedRows_fn>(library, "nvmlDeviceGetRemappedRows");
  f.processes = find_versions<nvmlDeviceGetProcesses_fn>(
      library, {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"});
  f.processes_v1 = find<nvmlDeviceGetProcesses_v1_fn>(library, "nvmlDeviceGetComputeRunningProcesses");
  f.process_utilization = find<nvmlDeviceGetProcessUtilization_fn>(library, "nvmlDeviceGetProcessUtilization");
  f.fabric_info = find<nvmlDeviceGetGpuFabricInfo_fn>(library, "nvmlDeviceGetGpuFabricInfo");

  f.nvlink_state = find<nvmlDeviceGetNvLinkState_fn>(library, "nvmlDeviceGetNvLinkState");
  f.nvlink_remote_pci = find_versions<nvmlDeviceGetNvLinkRemotePciInfo_fn>(
      library, {"nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo"});
  f.nvlink_remote_type = find<nvmlDeviceGetNvLinkRemoteDeviceType_fn>(library, "nvmlDeviceGetNvLinkRemoteDeviceType");
  f.nvlink_errors = find<nvmlDeviceGetNvLinkErrorCounter_fn>(library, "nvmlDeviceGetNvLinkErrorCounter");
  f.common_ancestor = find<nvmlDeviceGetTopologyCommonAncestor_fn>(library, "nvmlDeviceGetTopologyCommonAncestor");
  f.gpm_support = find<nvmlGpmQueryDeviceSupport_fn>(library, "nvmlGpmQueryDeviceSupport");
  f.gpm_sample_alloc = find<nvmlGpmSampleAlloc_fn>(library, "nvmlGpmSampleAlloc");
  f.gpm_sample_free = find<nvmlGpmSampleFree_fn>(library, "nvmlGpmSampleFree");
  f.gpm_sample_get = find<nvmlGpmSampleGet_fn>(library, "nvmlGpmSampleGet");
  f.gpm_metrics_get = find<nvmlGpmMetricsGet_fn>(library, "nvmlGpmMetricsGet");
  return f;
}

std::string NvmlFunctions::missing_required() const {
  std::string missing;
  auto need = [&](bool present, const char* name) {
    if (present) return;
    if (!missing.empty()) missing += ", ";
    missing += name;
  };
  need(!init.empty(), "nvmlInit_v2");
  need(bool(shutdown), "nvmlShutdown");
  need(!device_count.empty(), "nvmlDeviceGetCount_v2");
  need(!handle_by_index.empty(), "nvmlDeviceGetHandleByIndex_v2");
  return missing;
}

std::string NvmlFunctions::error_text(nvmlReturn_t code) const {
  if (error_string) {
    if (const char* text = error_string.fn(code)) return text;
  }
  return "NVML error " + std::to_string(static_cast<int>(code));
}

}  // namespace lockstep::gpu
