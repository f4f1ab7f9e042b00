// The NVML C functions the loader looks up, answered from the profile that
// LOCKSTEP_NVML_PROFILE names (read at the first nvmlInit, like a driver's state). A
// function listed in the profile's "fail" map returns that code instead; fields a profile
// leaves out answer NVML_ERROR_NOT_SUPPORTED.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include "standin_profile.h"

#define STANDIN_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using nvml_standin::Device;
using nvml_standin::Profile;

std::mutex mutex;
int init_count = 0;  // nvmlInit / nvmlShutdown nest, as NVML's do
std::optional<Profile> profile;

nvmlReturn_t init(const char* function) {
  std::lock_guard lock(mutex);
  if (init_count > 0) {
    ++init_count;
    return NVML_SUCCESS;
  }
  const char* path = std::getenv("LOCKSTEP_NVML_PROFILE");
  if (path == nullptr || *path == '\0') {
    std::fprintf(stderr, "nvml stand-in: LOCKSTEP_NVML_PROFILE names no profile file\n");
    return NVML_ERROR_UNKNOWN;
  }
  try {
    Profile loaded = nvml_standin::load_profile(path);
    if (nvmlReturn_t code = loaded.failure(function, nullptr); code != NVML_SUCCESS) return code;
    profile = std::move(loaded);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvml stand-in: %s\n", e.what());
    return NVML_ERROR_UNKNOWN;
  }
  ++init_count;
  return NVML_SUCCESS;
}

// Runs `answer` under the lock once NVML is initialized and the profile lets `function` succeed.
template <typename Answer>
nvmlReturn_t system_call(const char* function, Answer answer) {
  std::lock_guard lock(mutex);
  if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (nvmlReturn_t code = profile->failure(function, nullptr); code != NVML_SUCCESS) return code;
  return answer(*profile);
}

template <typename Answer>
nvmlReturn_t device_call(const char* function, nvmlDevice_t handle, Answer answer) {
  std::lock_guard lock(mutex);
  if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
  for (auto& device : profile->devices) {
    if (reinterpret_cast<nvmlDevice_t>(&device) != handle) continue;
    if (nvmlReturn_t code = profile->failure(function, &device); code != NVML_SUCCESS) return code;
    return answer(device);
  }
  return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t copy_string(const std::string& text, char* out, unsigned length) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (text.size() + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, text.c_str(), text.size() + 1);
  return NVML_SUCCESS;
}

nvmlReturn_t string_field(Device& device, const char* key, char* out, unsigned length) {
  if (!device.fields.contains(key)) return NVML_ERROR_NOT_SUPPORTED;
  return copy_string(device.fields[key].get<std::string>(), out, length);
}

template <typename T>
nvmlReturn_t reading(Device& device, const std::string& path, T* out) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  uint64_t value = 0;
  if (!device.take(path, value)) return NVML_ERROR_NOT_SUPPORTED;
  *out = static_cast<T>(value);
  return NVML_SUCCESS;
}

template <typename Info>
nvmlReturn_t processes(Device& device, unsigned* count, Info* infos) {
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const unsigned capacity = *count;
  *count = static_cast<unsigned>(device.processes.size());
  if (device.processes.size() > capacity) return NVML_ERROR_INSUFFICIENT_SIZE;
  if (device.processes.empty()) return NVML_SUCCESS;
  if (infos == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  for (size_t k = 0; k < device.processes.size(); ++k) {
    Info info{};
    info.pid = device.processes[k].pid;
    info.usedGpuMemory = device.processes[k].used;
    if constexpr (sizeof(Info) == sizeof(nvmlProcessInfo_t)) {
      info.gpuInstanceId = 0xFFFFFFFF;
      info.computeInstanceId = 0xFFFFFFFF;
    }
    infos[k] = info;
  }
  return NVML_SUCCESS;
}

nvmlReturn_t memory(Device& device, unsigned long long& total, unsigned long long& reserved, unsigned long long& used) {
  uint64_t value = 0;
  if (!device.take("/memory/total", value)) return NVML_ERROR_NOT_SUPPORTED;
  total = value;
  reserved = device.take("/memory/reserved", value) ? value : 0;
  used = device.take("/memory/used", value) ? value : 0;
  return NVML_SUCCESS;
}

// Links are answered only by GPUs that have some; others say Not Supported, like PCIe GPUs.
template <typename Answer>
nvmlReturn_t on_link(Device& device, unsigned link, Answer answer) {
  if (device.links.empty()) return NVML_ERROR_NOT_SUPPORTED;
  if (link >= device.links.size()) return NVML_ERROR_INVALID_ARGUMENT;
  return answer(device.links[link]);
}

nvmlGpuTopologyLevel_t ancestor_level(const std::string& entry) {
  if (entry == "X") return NVML_TOPOLOGY_INTERNAL;
  if (entry == "PIX") return NVML_TOPOLOGY_SINGLE;
  if (entry == "PXB") return NVML_TOPOLOGY_MULTIPLE;
  if (entry == "PHB") return NVML_TOPOLOGY_HOSTBRIDGE;
  if (entry == "NODE") return NVML_TOPOLOGY_NODE;
  return NVML_TOPOLOGY_SYSTEM;  // SYS, and NVLink pairs (the profile gives no PCIe path for them)
}

}  // namespace

STANDIN_EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(__func__); }
STANDIN_EXPORT nvmlReturn_t nvmlInit(void) { return init(__func__); }

STANDIN_EXPORT nvmlReturn_t nvmlShutdown(void) {
  std::lock_guard lock(mutex);
  if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (--init_count == 0) profile.reset();
  return NVML_SUCCESS;
}

STANDIN_EXPORT const char* nvmlErrorString(nvmlReturn_t code) { return nvml_standin::error_string(code); }

STANDIN_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned length) {
  return system_call(__func__, [&](Profile& p) { return copy_string(p.driver_version, version, length); });
}
STANDIN_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned length) {
  return system_call(__func__, [&](Profile& p) { return copy_string(p.nvml_version, version, length); });
}
static nvmlReturn_t cuda_driver_version(const char* function, int* version) {
  return system_call(function, [&](Profile& p) {
    if (version == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    *version = p.cuda_driver_version;
    return NVML_SUCCESS;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* version) {
  return cuda_driver_version(__func__, version);
}
STANDIN_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* version) {
  return cuda_driver_version(__func__, version);
}

static nvmlReturn_t device_count(const char* function, unsigned* count) {
  return system_call(function, [&](Profile& p) {
    if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    *count = static_cast<unsigned>(p.devices.size());
    return NVML_SUCCESS;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned* count) { return device_count(__func__, count); }
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* count) { return device_count(__func__, count); }

static nvmlReturn_t handle_by_index(const char* function, unsigned index, nvmlDevice_t* device) {
  return system_call(function, [&](Profile& p) {
    if (device == nullptr || index >= p.devices.size()) return NVML_ERROR_INVALID_ARGUMENT;
    if (nvmlReturn_t code = p.failure(function, &p.devices[index]); code != NVML_SUCCESS) return code;
    *device = reinterpret_cast<nvmlDevice_t>(&p.devices[index]);
    return NVML_SUCCESS;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned index, nvmlDevice_t* device) {
  return handle_by_index(__func__, index, device);
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t* device) {
  return handle_by_index(__func__, index, device);
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char* name, unsigned length) {
  return device_call(__func__, h, [&](Device& d) { return string_field(d, "name", name, length); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char* uuid, unsigned length) {
  return device_call(__func__, h, [&](Device& d) { return string_field(d, "uuid", uuid, length); });
}
static nvmlReturn_t pci_info(const char* function, nvmlDevice_t h, nvmlPciInfo_t* pci) {
  return device_call(function, h, [&](Device& d) {
    if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    *pci = d.pci;
    return NVML_SUCCESS;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t h, nvmlPciInfo_t* pci) {
  return pci_info(__func__, h, pci);
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t* pci) {
  return pci_info(__func__, h, pci);
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t h, int* major, int* minor) {
  return device_call(__func__, h, [&](Device& d) {
    if (major == nullptr || minor == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d.fields.contains("compute_capability")) return NVML_ERROR_NOT_SUPPORTED;
    const std::string text = d.fields["compute_capability"].get<std::string>();  // "8.0"
    if (std::sscanf(text.c_str(), "%d.%d", major, minor) != 2) return NVML_ERROR_UNKNOWN;
    return NVML_SUCCESS;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t h, unsigned* cores) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/cuda_cores", cores); });
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t* out) {
  return device_call(__func__, h, [&](Device& d) {
    if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total = 0, reserved = 0, used = 0;
    if (nvmlReturn_t code = memory(d, total, reserved, used); code != NVML_SUCCESS) return code;
    out->total = total;
    out->used = used + reserved;  // v1 counts what the driver reserves as used
    out->free = total - reserved - used;
    return NVML_SUCCESS;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t* out) {
  return device_call(__func__, h, [&](Device& d) {
    if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    if (out->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total = 0, reserved = 0, used = 0;
    if (nvmlReturn_t code = memory(d, total, reserved, used); code != NVML_SUCCESS) return code;
    out->total = total;
    out->reserved = reserved;
    out->used = used;
    out->free = total - reserved - used;
    return NVML_SUCCESS;
  });
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t* out) {
  return device_call(__func__, h, [&](Device& d) {
    if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    if (nvmlReturn_t code = reading(d, "/utilization/gpu", &out->gpu); code != NVML_SUCCESS) return code;
    return reading(d, "/utilization/memory", &out->memory);
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t h, nvmlTemperatureSensors_t sensor, unsigned* c) {
  return device_call(__func__, h, [&](Device& d) {
    if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    return reading(d, "/temperature_c", c);
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned* mw) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/power_mw", mw); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t h, unsigned* mw) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/power_limit_mw", mw); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t h, nvmlClockType_t type, unsigned* mhz) {
  return device_call(__func__, h, [&](Device& d) {
    if (type == NVML_CLOCK_MEM) return reading(d, "/memory_clock_mhz", mhz);
    return type == NVML_CLOCK_SM ? reading(d, "/sm_clock_mhz", mhz) : NVML_ERROR_NOT_SUPPORTED;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t h, unsigned long long* mj) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/energy_mj", mj); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t h, unsigned* generation) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/pcie/generation", generation); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t h, unsigned* generation) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/pcie/generation_max", generation); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t h, unsigned* generation) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/pcie/gpu_generation_max", generation); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t h, unsigned* width) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/pcie/width", width); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t h, unsigned* width) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/pcie/width_max", width); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t h, nvmlPcieUtilCounter_t counter,
                                                        unsigned* kb_per_s) {
  return device_call(__func__, h, [&](Device& d) {
    return reading(d, counter == NVML_PCIE_UTIL_TX_BYTES ? "/pcie/tx_kb_per_s" : "/pcie/rx_kb_per_s", kb_per_s);
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t h, nvmlClockType_t type, unsigned* mhz) {
  return device_call(__func__, h, [&](Device& d) {
    return type == NVML_CLOCK_SM ? reading(d, "/sm_clock_max_mhz", mhz) : NVML_ERROR_NOT_SUPPORTED;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t h, unsigned long long* reasons) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/throttle_reasons", reasons); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t h, unsigned long long* reasons) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/throttle_reasons", reasons); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t h, nvmlEnableState_t* mode) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/persistence_mode", mode); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t h, nvmlEnableState_t* current,
                                                 nvmlEnableState_t* pending) {
  return device_call(__func__, h, [&](Device& d) {
    if (pending == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t code = reading(d, "/ecc/enabled", current);
    if (code == NVML_SUCCESS) *pending = *current;
    return code;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t h, nvmlMemoryErrorType_t type,
                                                        nvmlEccCounterType_t counter, unsigned long long* count) {
  return device_call(__func__, h, [&](Device& d) {
    uint64_t enabled = 0;
    if (!d.take("/ecc/enabled", enabled) || enabled == 0) return NVML_ERROR_NOT_SUPPORTED;
    const char* which = type == NVML_MEMORY_ERROR_TYPE_CORRECTED ? "corrected" : "uncorrected";
    const char* scope = counter == NVML_VOLATILE_ECC ? "volatile" : "aggregate";
    return reading(d, std::string("/ecc/") + which + "_" + scope, count);
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t h, nvmlPageRetirementCause_t cause, unsigned* count,
                                                      unsigned long long* addresses) {
  return device_call(__func__, h, [&](Device& d) {
    if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned pages = 0;
    const char* path = cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR ? "/retired_pages/double_bit"
                                                                                : "/retired_pages/single_bit";
    if (nvmlReturn_t code = reading(d, path, &pages); code != NVML_SUCCESS) return code;
    const unsigned capacity = *count;
    *count = pages;
    if (pages > capacity) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned k = 0; k < pages; ++k) addresses[k] = 0x1a2b000ULL + 0x1000ULL * k;
    return NVML_SUCCESS;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t h, unsigned* correctable, unsigned* uncorrectable,
                                                      unsigned* pending, unsigned* failure) {
  return device_call(__func__, h, [&](Device& d) {
    // A profile without remapped_rows is a GPU that has none (before Ampere): Not Supported.
    for (const auto& [path, out] : {std::pair<const char*, unsigned*>{"/remapped_rows/correctable", correctable},
                                    {"/remapped_rows/uncorrectable", uncorrectable},
                                    {"/remapped_rows/pending", pending},
                                    {"/remapped_rows/failure", failure}}) {
      if (nvmlReturn_t code = reading(d, path, out); code != NVML_SUCCESS) return code;
    }
    return NVML_SUCCESS;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t h, nvmlEnableState_t* pending) {
  return device_call(__func__, h, [&](Device& d) { return reading(d, "/retired_pages/pending", pending); });
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t h, unsigned* count,
                                                                 nvmlProcessInfo_v1_t* infos) {
  return device_call(__func__, h, [&](Device& d) { return processes(d, count, infos); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t h, unsigned* count,
                                                                    nvmlProcessInfo_t* infos) {
  return device_call(__func__, h, [&](Device& d) { return processes(d, count, infos); });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned* count,
                                                                    nvmlProcessInfo_t* infos) {
  return device_call(__func__, h, [&](Device& d) { return processes(d, count, infos); });
}

// Per-process utilization samples: one per process the profile gives "sm_util" for, stamped
// with the call count so each call's samples are newer than the last's.
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h, nvmlProcessUtilizationSample_t* samples,
                                                            unsigned* count, unsigned long long /*last_seen*/) {
  return device_call(__func__, h, [&](Device& d) {
    if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    std::vector<nvmlProcessUtilizationSample_t> taken;
    const nlohmann::json listed = d.fields.value("processes", nlohmann::json::array());
    for (size_t k = 0; k < d.processes.size() && k < listed.size(); ++k) {
      const nlohmann::json& process = listed[k];
      if (!process.contains("sm_util")) continue;
      nvmlProcessUtilizationSample_t sample{};
      sample.pid = d.processes[k].pid;  // "self" resolved
      sample.timeStamp = 1000000ULL * ++d.calls["process_utilization"];
      sample.smUtil = process.value("sm_util", 0u);
      sample.memUtil = process.value("mem_util", 0u);
      taken.push_back(sample);
    }
    if (taken.empty()) return NVML_ERROR_NOT_FOUND;
    const unsigned capacity = *count;
    *count = static_cast<unsigned>(taken.size());
    if (samples == nullptr || capacity < taken.size()) return NVML_ERROR_INSUFFICIENT_SIZE;
    std::copy(taken.begin(), taken.end(), samples);
    return NVML_SUCCESS;
  });
}

// {"state": 3, "status": 0}: the fabric manager's registration of the GPU (Hopper NVSwitch).
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t h, nvmlGpuFabricInfo_t* info) {
  return device_call(__func__, h, [&](Device& d) {
    if (info == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t state = 0, status = 0;
    if (!d.take("/fabric/state", state)) return NVML_ERROR_NOT_SUPPORTED;
    d.take("/fabric/status", status);
    *info = nvmlGpuFabricInfo_t{};
    info->state = static_cast<nvmlGpuFabricState_t>(state);
    info->status = static_cast<nvmlReturn_t>(status);
    return NVML_SUCCESS;
  });
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t h, unsigned link, nvmlEnableState_t* active) {
  return device_call(__func__, h, [&](Device& d) {
    return on_link(d, link, [&](const nvml_standin::Link&) {
      *active = NVML_FEATURE_ENABLED;
      return NVML_SUCCESS;
    });
  });
}
static nvmlReturn_t remote_pci(const char* function, nvmlDevice_t h, unsigned link, nvmlPciInfo_t* pci) {
  return device_call(function, h, [&](Device& d) {
    return on_link(d, link, [&](const nvml_standin::Link& l) {
      *pci = l.remote;
      return NVML_SUCCESS;
    });
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t h, unsigned link, nvmlPciInfo_t* pci) {
  return remote_pci(__func__, h, link, pci);
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t h, unsigned link, nvmlPciInfo_t* pci) {
  return remote_pci(__func__, h, link, pci);
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t h, unsigned link,
                                                                nvmlIntNvLinkDeviceType_t* type) {
  return device_call(__func__, h, [&](Device& d) {
    return on_link(d, link, [&](const nvml_standin::Link& l) {
      *type = l.remote_type;
      return NVML_SUCCESS;
    });
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b,
                                                                nvmlGpuTopologyLevel_t* level) {
  return device_call(__func__, a, [&](Device& first) {
    if (profile->topology.empty()) return NVML_ERROR_NOT_SUPPORTED;
    for (const auto& second : profile->devices) {
      if (reinterpret_cast<nvmlDevice_t>(const_cast<Device*>(&second)) != b) continue;
      *level = ancestor_level(profile->topology[first.index][second.index]);
      return NVML_SUCCESS;
    }
    return NVML_ERROR_INVALID_ARGUMENT;
  });
}
// {"replay": 3, "crc_flit": 12}: counts on the GPU's first link; its other links count none.
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t h, unsigned link,
                                                            nvmlNvLinkErrorCounter_t counter,
                                                            unsigned long long* value) {
  return device_call(__func__, h, [&](Device& d) {
    return on_link(d, link, [&](const nvml_standin::Link&) {
      if (value == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
      const char* names[] = {"replay", "recovery", "crc_flit", "crc_data"};
      if (counter < NVML_NVLINK_ERROR_DL_REPLAY || counter > NVML_NVLINK_ERROR_DL_CRC_DATA)
        return NVML_ERROR_NOT_SUPPORTED;
      uint64_t count = 0;
      if (link == 0) d.take(std::string("/nvlink_errors/") + names[counter], count);
      *value = count;
      return NVML_SUCCESS;
    });
  });
}

// GPM (Hopper and later): GPUs whose profile has a "gpm" object support it. A sample
// remembers its GPU; a metric between two samples is the profile's next reading of
// "gpm/<name>" (percent), Not Supported for a name the profile leaves out.
namespace {

struct GpmSample {
  Device* device = nullptr;  // set by nvmlGpmSampleGet
};
std::vector<GpmSample*> gpm_samples;  // allocated and not freed, under `mutex`

bool known_sample(nvmlGpmSample_t sample) {
  return std::find(gpm_samples.begin(), gpm_samples.end(), reinterpret_cast<GpmSample*>(sample)) != gpm_samples.end();
}

const char* gpm_metric_name(unsigned id) {
  switch (id) {
    case NVML_GPM_METRIC_GRAPHICS_UTIL:
      return "graphics_util";
    case NVML_GPM_METRIC_SM_UTIL:
      return "sm_util";
    case NVML_GPM_METRIC_SM_OCCUPANCY:
      return "sm_occupancy";
    case NVML_GPM_METRIC_ANY_TENSOR_UTIL:
      return "any_tensor_util";
    case NVML_GPM_METRIC_DRAM_BW_UTIL:
      return "dram_bw_util";
    case NVML_GPM_METRIC_FP64_UTIL:
      return "fp64_util";
    case NVML_GPM_METRIC_FP32_UTIL:
      return "fp32_util";
    case NVML_GPM_METRIC_FP16_UTIL:
      return "fp16_util";
    default:
      return nullptr;
  }
}

}  // namespace

STANDIN_EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t h, nvmlGpmSupport_t* support) {
  return device_call(__func__, h, [&](Device& d) {
    if (support == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    if (support->version != NVML_GPM_SUPPORT_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = d.fields.contains("gpm") ? 1 : 0;
    return NVML_SUCCESS;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t* sample) {
  return system_call(__func__, [&](Profile&) {
    if (sample == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    gpm_samples.push_back(new GpmSample);
    *sample = reinterpret_cast<nvmlGpmSample_t>(gpm_samples.back());
    return NVML_SUCCESS;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
  return system_call(__func__, [&](Profile&) {
    if (!known_sample(sample)) return NVML_ERROR_INVALID_ARGUMENT;
    std::erase(gpm_samples, reinterpret_cast<GpmSample*>(sample));
    delete reinterpret_cast<GpmSample*>(sample);
    return NVML_SUCCESS;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t h, nvmlGpmSample_t sample) {
  return device_call(__func__, h, [&](Device& d) {
    if (!known_sample(sample)) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d.fields.contains("gpm")) return NVML_ERROR_NOT_SUPPORTED;
    reinterpret_cast<GpmSample*>(sample)->device = &d;
    return NVML_SUCCESS;
  });
}
STANDIN_EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t* request) {
  return system_call(__func__, [&](Profile&) {
    if (request == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    if (request->version != NVML_GPM_METRICS_GET_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!known_sample(request->sample1) || !known_sample(request->sample2)) return NVML_ERROR_INVALID_ARGUMENT;
    Device* device = reinterpret_cast<GpmSample*>(request->sample1)->device;
    if (device == nullptr || device != reinterpret_cast<GpmSample*>(request->sample2)->device ||
        request->sample1 == request->sample2 || request->numMetrics > 98)  // CUDA 12's smallest array
      return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned k = 0; k < request->numMetrics; ++k) {
      nvmlGpmMetric_t& metric = request->metrics[k];
      uint64_t percent = 0;
      const char* name = gpm_metric_name(metric.metricId);
      metric.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
      if (name != nullptr && device->take(std::string("/gpm/") + name, percent)) {
        metric.value = static_cast<double>(percent);
        metric.nvmlReturn = NVML_SUCCESS;
      }
    }
    return NVML_SUCCESS;
  });
}
