#include "lockstep/gpu/nvml.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "lockstep/core/error.h"
#include "lockstep/gpu/nvml_functions.h"
#include "lockstep/gpu/nvml_topology.h"
#include "lockstep/gpu/process_details.h"

namespace lockstep::gpu {

struct Nvml::Library {
  void* handle = nullptr;
  std::string path;
  std::string error;
  NvmlFunctions nvml;
  // Each GPU's GPM sample of the previous reading (by NVML index): the next reading's
  // activity is measured from it.
  std::mutex gpm_mutex;
  std::map<unsigned, nvmlGpmSample_t> gpm_previous;
};

namespace {

constexpr const char* kDriverLibrary = "libnvidia-ml.so.1";

// The file dlopen picked, symlinks resolved: libnvidia-ml.so.1 -> libnvidia-ml.so.535.129.03
// says which driver answered (and gives away a CUDA stub found first on the path).
std::string loaded_path(void* handle, const std::string& requested) {
  link_map* map = nullptr;
  std::string path = requested;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && *map->l_name)
    path = map->l_name;
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) != nullptr) path = resolved;
  return path;
}

std::string init_hint(nvmlReturn_t code) {
  switch (code) {
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "; the NVIDIA kernel module is not loaded (check `lsmod | grep nvidia`; a container must be started "
             "with the GPUs passed in)";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
      return "; the kernel module and this library come from different driver versions, usually after a driver "
             "update without a reboot: reboot, or unload and reload the nvidia kernel modules";
    case NVML_ERROR_NO_PERMISSION:
      return "; this user may not open /dev/nvidia*: check those files' permissions";
    default:
      return "";
  }
}

// CUDA cores per multiprocessor by compute capability (the table CUDA's samples keep in
// _ConvertSMVer2Cores). NVML counts cores, not SMs; dividing gives the SM count exactly
// for these architectures.
std::optional<unsigned> cuda_cores_per_multiprocessor(int major, int minor) {
  switch (major) {
    case 3:
      return 192;  // Kepler
    case 5:
      return 128;  // Maxwell
    case 6:
      return minor == 0 ? 64 : 128;  // GP100; GP10x
    case 7:
      return 64;  // Volta, Turing
    case 8:
      return minor == 0 ? 64 : 128;  // GA100; GA10x, AD10x
    case 9:
      return 128;  // Hopper
    case 10:
    case 12:
      return 128;  // Blackwell
    default:
      return std::nullopt;
  }
}

// Lists a device's compute processes through one version of the call. The list can grow
// between the size query and the read, hence the loop.
template <typename Info, typename Fn>
nvmlReturn_t list_processes(Fn fn, nvmlDevice_t handle, std::vector<GpuProcess>& out) {
  std::vector<Info> infos(8);
  for (int attempt = 0; attempt < 5; ++attempt) {
    unsigned count = static_cast<unsigned>(infos.size());
    nvmlReturn_t code = fn(handle, &count, infos.data());
    if (code == NVML_ERROR_INSUFFICIENT_SIZE) {
      infos.resize(std::max<size_t>(count, infos.size()) * 2);
      continue;
    }
    if (code != NVML_SUCCESS) return code;
    out.clear();
    for (unsigned k = 0; k < std::min<size_t>(count, infos.size()); ++k) {
      GpuProcess process;
      process.pid = infos[k].pid;
      if (infos[k].usedGpuMemory != NVML_VALUE_NOT_AVAILABLE) process.used_bytes = infos[k].usedGpuMemory;
      out.push_back(process);
    }
    return NVML_SUCCESS;
  }
  return NVML_ERROR_INSUFFICIENT_SIZE;
}

// Reads one device; every optional call that fails is noted in `device.unavailable`.
class DeviceReader {
 public:
  DeviceReader(const NvmlFunctions& nvml, nvmlDevice_t handle, GpuDevice& device)
      : nvml_(nvml), handle_(handle), device_(device) {}

  template <typename Fn, typename... Args>
  bool call(const NvmlEntry<Fn>& entry, Args... args) {
    if (!entry) return note_missing(entry.name);
    return check(entry.name, entry.fn(handle_, args...));
  }

  template <typename Fn, typename... Args>
  bool call_newest(const NvmlVersions<Fn>& versions, const char* newest_name, Args... args) {
    if (versions.empty()) return note_missing(newest_name);
    const char* used = newest_name;
    nvmlReturn_t code = gpu::call_newest(versions, newest_name, used, handle_, args...);
    return check(used, code);
  }

  bool check(const char* name, nvmlReturn_t code) {
    if (code == NVML_SUCCESS) return true;
    note(name, nvml_.error_text(code));
    return false;
  }
  bool note_missing(const char* name) {
    note(name, "not exported by this NVML library");
    return false;
  }
  void note(const std::string& name, const std::string& why) { device_.unavailable.push_back(name + ": " + why); }

  void read_identity(nvmlPciInfo_t& pci) {
    char text[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
    if (call(nvml_.name, text, unsigned{sizeof text})) device_.name = text;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    if (call(nvml_.uuid, uuid, unsigned{sizeof uuid})) device_.uuid = uuid;
    if (call_newest(nvml_.pci_info, "nvmlDeviceGetPciInfo_v3", &pci))
      device_.pci_bus_id = pci.busId[0] != '\0' ? pci.busId : pci.busIdLegacy;
    call(nvml_.compute_capability, &device_.compute_major, &device_.compute_minor);
    unsigned cores = 0;
    if (call(nvml_.gpu_cores, &cores)) {
      if (auto per_sm = cuda_cores_per_multiprocessor(device_.compute_major, device_.compute_minor))
        device_.multiprocessors = cores / *per_sm;
      else
        note("multiprocessors", "no CUDA-cores-per-SM figure for compute capability " +
                                    std::to_string(device_.compute_major) + "." +
                                    std::to_string(device_.compute_minor));
    }
  }

  void read_memory() {
    if (nvml_.memory_v2) {
      nvmlMemory_v2_t memory{};
      memory.version = nvmlMemory_v2;
      nvmlReturn_t code = nvml_.memory_v2.fn(handle_, &memory);
      if (code == NVML_SUCCESS) {
        device_.memory_total = memory.total;
        device_.memory_reserved = memory.reserved;
        device_.memory_used = memory.used;
        device_.memory_free = memory.free;
        return;
      }
      if (!try_older_version(code)) {
        check(nvml_.memory_v2.name, code);
        return;
      }
      note(nvml_.memory_v2.name, nvml_.error_text(code) + " (memory used includes the driver's reserved memory)");
    } else {
      note(nvml_.memory_v2.name,
           "not exported by this NVML library (memory used includes the driver's reserved memory)");
    }
    nvmlMemory_t memory{};
    if (call(nvml_.memory_v1, &memory)) {
      device_.memory_total = memory.total;
      device_.memory_used = memory.used;
      device_.memory_free = memory.free;
    }
  }

  void read_readings() {
    nvmlUtilization_t utilization{};
    if (call(nvml_.utilization, &utilization)) {
      device_.utilization_gpu = utilization.gpu;
      device_.utilization_memory = utilization.memory;
    }
    unsigned value = 0;
    if (call(nvml_.temperature, NVML_TEMPERATURE_GPU, &value)) device_.temperature_c = value;
    if (call(nvml_.power_usage, &value)) device_.power_mw = value;
    if (call(nvml_.power_limit, &value)) device_.power_limit_mw = value;
    if (call(nvml_.clock, NVML_CLOCK_SM, &value)) device_.sm_clock_mhz = value;
    if (call(nvml_.max_clock, NVML_CLOCK_SM, &value)) device_.sm_clock_max_mhz = value;
    if (call(nvml_.clock, NVML_CLOCK_MEM, &value)) device_.memory_clock_mhz = value;
    unsigned long long reasons = 0;
    if (call_newest(nvml_.clocks_reasons, "nvmlDeviceGetCurrentClocksEventReasons", &reasons))
      device_.throttle_reasons = reasons;
    unsigned long long energy = 0;
    if (call(nvml_.energy, &energy)) device_.energy_mj = energy;
    read_pcie();
  }

  void read_pcie() {
    unsigned value = 0;
    if (call(nvml_.pcie_generation, &value)) device_.pcie_generation = value;
    if (call(nvml_.pcie_generation_max, &value)) device_.pcie_generation_max = value;
    if (call(nvml_.pcie_generation_gpu_max, &value)) device_.pcie_generation_gpu_max = value;
    if (call(nvml_.pcie_width, &value)) device_.pcie_width = value;
    if (call(nvml_.pcie_width_max, &value)) device_.pcie_width_max = value;
    if (call(nvml_.pcie_throughput, NVML_PCIE_UTIL_TX_BYTES, &value)) device_.pcie_tx_kb_per_s = value;
    if (call(nvml_.pcie_throughput, NVML_PCIE_UTIL_RX_BYTES, &value)) device_.pcie_rx_kb_per_s = value;
  }

  // The error counters of every active NVLink. A GPU without NVLink answers the state call
  // with Not Supported, which is no failure.
  void read_nvlink_health() {
    if (!nvml_.nvlink_state) return;
    NvlinkErrors errors;
    for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
      nvmlEnableState_t active = NVML_FEATURE_DISABLED;
      if (nvml_.nvlink_state.fn(handle_, link, &active) != NVML_SUCCESS || active != NVML_FEATURE_ENABLED) continue;
      ++errors.links;
      nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
      if (nvml_.nvlink_remote_type && nvml_.nvlink_remote_type.fn(handle_, link, &type) == NVML_SUCCESS &&
          type == NVML_NVLINK_DEVICE_TYPE_SWITCH)
        device_.behind_nvswitch = true;
      for (auto [counter, total] : {std::pair{NVML_NVLINK_ERROR_DL_REPLAY, &errors.replay},
                                    {NVML_NVLINK_ERROR_DL_RECOVERY, &errors.recovery},
                                    {NVML_NVLINK_ERROR_DL_CRC_FLIT, &errors.crc_flit},
                                    {NVML_NVLINK_ERROR_DL_CRC_DATA, &errors.crc_data}}) {
        unsigned long long count = 0;
        if (!nvml_.nvlink_errors) return (void)note_missing(nvml_.nvlink_errors.name);
        const nvmlReturn_t code = nvml_.nvlink_errors.fn(handle_, link, counter, &count);
        if (code == NVML_ERROR_NOT_SUPPORTED) continue;  // a counter this generation lacks
        if (!check(nvml_.nvlink_errors.name, code)) return;
        *total += count;
      }
    }
    if (errors.links > 0) device_.nvlink_errors = errors;
  }

  // Hopper and later on NVSwitch; other GPUs answer Not Supported, which is no failure.
  void read_fabric() {
    if (!nvml_.fabric_info) return;
    nvmlGpuFabricInfo_t info{};
    const nvmlReturn_t code = nvml_.fabric_info.fn(handle_, &info);
    if (code == NVML_ERROR_NOT_SUPPORTED || (code == NVML_SUCCESS && info.state == NVML_GPU_FABRIC_STATE_NOT_SUPPORTED))
      return;
    if (!check(nvml_.fabric_info.name, code)) return;
    switch (info.state) {
      case NVML_GPU_FABRIC_STATE_NOT_STARTED:
        device_.fabric_state = FabricState::kNotStarted;
        break;
      case NVML_GPU_FABRIC_STATE_IN_PROGRESS:
        device_.fabric_state = FabricState::kInProgress;
        break;
      default:
        device_.fabric_state = FabricState::kCompleted;
        if (info.status != NVML_SUCCESS) device_.fabric_error = nvml_.error_text(info.status);
    }
  }

  void read_health() {
    nvmlEnableState_t state = NVML_FEATURE_DISABLED;
    if (call(nvml_.persistence_mode, &state)) device_.persistence_mode = state == NVML_FEATURE_ENABLED;
    nvmlEnableState_t current = NVML_FEATURE_DISABLED, pending = NVML_FEATURE_DISABLED;
    if (call(nvml_.ecc_mode, &current, &pending)) {
      device_.ecc_enabled = current == NVML_FEATURE_ENABLED;
      // With ECC off there are no counters to read (NVML answers Not Supported).
      unsigned long long count = 0;
      if (*device_.ecc_enabled) {
        if (call(nvml_.ecc_errors, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &count))
          device_.ecc_uncorrected_volatile = count;
        if (call(nvml_.ecc_errors, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, &count))
          device_.ecc_corrected_volatile = count;
      }
    }
    read_retired_pages();
    read_remapped_rows();
    read_nvlink_health();
    read_fabric();
  }

  void read_remapped_rows() {
    unsigned correctable = 0, uncorrectable = 0, pending = 0, failed = 0;
    if (!nvml_.remapped_rows) return (void)note_missing(nvml_.remapped_rows.name);
    const nvmlReturn_t code = nvml_.remapped_rows.fn(handle_, &correctable, &uncorrectable, &pending, &failed);
    if (code == NVML_ERROR_NOT_SUPPORTED) return;  // before Ampere: pages are retired instead
    if (!check(nvml_.remapped_rows.name, code)) return;
    device_.remapped_rows_correctable = correctable;
    device_.remapped_rows_uncorrectable = uncorrectable;
    device_.remap_pending = pending != 0;
    device_.remap_failed = failed != 0;
  }

  void read_retired_pages() {
    unsigned total = 0;
    for (auto cause :
         {NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR}) {
      if (!nvml_.retired_pages) return (void)note_missing(nvml_.retired_pages.name);
      // A zero-sized buffer asks for the count: Success (none) or Insufficient Size (count set).
      unsigned count = 0;
      unsigned long long unused_address = 0;
      nvmlReturn_t code = nvml_.retired_pages.fn(handle_, cause, &count, &unused_address);
      // Ampere and later retire no pages: they remap rows (read_remapped_rows).
      if (code == NVML_ERROR_NOT_SUPPORTED) return;
      if (code != NVML_SUCCESS && code != NVML_ERROR_INSUFFICIENT_SIZE)
        return (void)check(nvml_.retired_pages.name, code);
      total += count;
    }
    device_.retired_pages = total;
    nvmlEnableState_t pending = NVML_FEATURE_DISABLED;
    if (call(nvml_.retired_pages_pending, &pending)) device_.retired_pages_pending = pending == NVML_FEATURE_ENABLED;
  }

  void read_processes() {
    std::vector<GpuProcess> processes;
    const char* used = "nvmlDeviceGetComputeRunningProcesses_v3";
    nvmlReturn_t code = NVML_ERROR_FUNCTION_NOT_FOUND;
    for (const auto& entry : nvml_.processes) {
      used = entry.name;
      code = list_processes<nvmlProcessInfo_t>(entry.fn, handle_, processes);
      if (!try_older_version(code)) break;
    }
    if (try_older_version(code) && nvml_.processes_v1) {
      used = nvml_.processes_v1.name;
      code = list_processes<nvmlProcessInfo_v1_t>(nvml_.processes_v1.fn, handle_, processes);
    }
    if (!check(used, code)) return;
    for (auto& process : processes) fill_process_details(process);
    read_process_utilization(processes);
    device_.processes = std::move(processes);
  }

  // NVML keeps a few recent samples per process; the newest of each is its share now. No
  // sample at all (every process idle) is answered with Not Found, which is no failure.
  void read_process_utilization(std::vector<GpuProcess>& processes) {
    if (processes.empty()) return;
    if (!nvml_.process_utilization) return (void)note_missing(nvml_.process_utilization.name);
    unsigned count = 0;
    nvmlReturn_t code = nvml_.process_utilization.fn(handle_, nullptr, &count, 0);
    if (code == NVML_ERROR_NOT_FOUND) return;
    if (code != NVML_SUCCESS && code != NVML_ERROR_INSUFFICIENT_SIZE)
      return (void)check(nvml_.process_utilization.name, code);
    if (count == 0) return;
    std::vector<nvmlProcessUtilizationSample_t> samples(count);
    code = nvml_.process_utilization.fn(handle_, samples.data(), &count, 0);
    if (code == NVML_ERROR_NOT_FOUND) return;
    if (!check(nvml_.process_utilization.name, code)) return;
    samples.resize(std::min<size_t>(count, samples.size()));
    for (GpuProcess& process : processes) {
      const nvmlProcessUtilizationSample_t* newest = nullptr;
      for (const auto& sample : samples) {
        if (sample.pid == process.pid && (newest == nullptr || sample.timeStamp > newest->timeStamp)) newest = &sample;
      }
      if (newest == nullptr) continue;
      process.sm_utilization = newest->smUtil;
      process.memory_utilization = newest->memUtil;
    }
  }

  // GPM: a new sample at every reading, and the activity between it and `previous` (the
  // last reading's, which is then freed; the new one takes its place). GPUs before Hopper
  // answer Not Supported or isSupportedDevice 0, which is no failure.
  void read_gpm(nvmlGpmSample_t& previous) {
    if (!nvml_.gpm_support || !nvml_.gpm_sample_alloc || !nvml_.gpm_sample_free || !nvml_.gpm_sample_get ||
        !nvml_.gpm_metrics_get)
      return;
    nvmlGpmSupport_t support{};
    support.version = NVML_GPM_SUPPORT_VERSION;
    const nvmlReturn_t code = nvml_.gpm_support.fn(handle_, &support);
    if (code == NVML_ERROR_NOT_SUPPORTED || (code == NVML_SUCCESS && support.isSupportedDevice == 0)) return;
    if (!check(nvml_.gpm_support.name, code)) return;
    nvmlGpmSample_t sample = nullptr;
    if (!check(nvml_.gpm_sample_alloc.name, nvml_.gpm_sample_alloc.fn(&sample))) return;
    if (!check(nvml_.gpm_sample_get.name, nvml_.gpm_sample_get.fn(handle_, sample))) {
      nvml_.gpm_sample_free.fn(sample);
      return;
    }
    if (previous != nullptr) {
      GpmActivity activity;
      const std::pair<unsigned, std::optional<double>*> wanted[] = {
          {NVML_GPM_METRIC_GRAPHICS_UTIL, &activity.graphics_engine},
          {NVML_GPM_METRIC_SM_UTIL, &activity.sm},
          {NVML_GPM_METRIC_SM_OCCUPANCY, &activity.sm_occupancy},
          {NVML_GPM_METRIC_ANY_TENSOR_UTIL, &activity.tensor},
          {NVML_GPM_METRIC_DRAM_BW_UTIL, &activity.dram},
          {NVML_GPM_METRIC_FP64_UTIL, &activity.fp64},
          {NVML_GPM_METRIC_FP32_UTIL, &activity.fp32},
          {NVML_GPM_METRIC_FP16_UTIL, &activity.fp16}};
      auto request = std::make_unique<nvmlGpmMetricsGet_t>();  // 13 KB: off the stack
      request->version = NVML_GPM_METRICS_GET_VERSION;
      request->numMetrics = std::size(wanted);
      request->sample1 = previous;
      request->sample2 = sample;
      for (size_t k = 0; k < std::size(wanted); ++k) request->metrics[k].metricId = wanted[k].first;
      if (check(nvml_.gpm_metrics_get.name, nvml_.gpm_metrics_get.fn(request.get()))) {
        // NVML gives percentages; DCGM's fields, and these, are fractions.
        for (size_t k = 0; k < std::size(wanted); ++k) {
          if (request->metrics[k].nvmlReturn == NVML_SUCCESS) *wanted[k].second = request->metrics[k].value / 100.0;
        }
        device_.gpm = activity;
      }
      nvml_.gpm_sample_free.fn(previous);
    }
    previous = sample;
  }

 private:
  const NvmlFunctions& nvml_;
  nvmlDevice_t handle_;
  GpuDevice& device_;
};

}  // namespace

std::string Nvml::requested_library() {
  const char* chosen = std::getenv("LOCKSTEP_NVML_LIBRARY");
  return chosen != nullptr && *chosen != '\0' ? chosen : kDriverLibrary;
}

Nvml::Nvml() : library_(std::make_unique<Library>()) {
  Library& lib = *library_;
  const std::string requested = requested_library();
  dlerror();
  lib.handle = dlopen(requested.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib.handle == nullptr) {
    const char* why = dlerror();
    lib.error = why != nullptr ? why : requested + ": cannot be loaded";
    if (requested == kDriverLibrary)
      lib.error += " (no NVIDIA driver is installed, or this container was started without the GPUs)";
    return;
  }
  lib.path = loaded_path(lib.handle, requested);
  lib.nvml = NvmlFunctions::resolve(lib.handle);
  std::string missing = lib.nvml.missing_required();
  if (!missing.empty()) {
    lib.error = lib.path + " is not a usable NVML library: it does not export " + missing;
  } else {
    const char* used = "nvmlInit_v2";
    nvmlReturn_t code = call_newest(lib.nvml.init, "nvmlInit_v2", used);
    if (code == NVML_SUCCESS) return;
    lib.error = std::string(used) + ": " + lib.nvml.error_text(code) + init_hint(code);
  }
  dlclose(lib.handle);
  lib.handle = nullptr;
  lib.nvml = NvmlFunctions{};
}

Nvml::~Nvml() {
  if (library_->handle == nullptr) return;
  for (auto& [index, sample] : library_->gpm_previous) {
    if (sample != nullptr) library_->nvml.gpm_sample_free.fn(sample);
  }
  library_->nvml.shutdown.fn();
  dlclose(library_->handle);
}

bool Nvml::loaded() const { return library_->handle != nullptr; }
const std::string& Nvml::library_path() const { return library_->path; }
const std::string& Nvml::load_error() const { return library_->error; }

GpuState Nvml::read(const Query& query) const {
  GpuState state;
  state.taken = std::chrono::system_clock::now();
  state.library_path = library_->path;
  state.load_error = library_->error;
  if (!loaded()) return state;
  const NvmlFunctions& nvml = library_->nvml;

  char text[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
  if (nvml.driver_version && nvml.driver_version.fn(text, sizeof text) == NVML_SUCCESS) state.driver_version = text;
  char version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE] = {};
  if (nvml.nvml_version && nvml.nvml_version.fn(version, sizeof version) == NVML_SUCCESS) state.nvml_version = version;
  const char* used = "";
  int cuda = 0;
  if (call_newest(nvml.cuda_driver_version, "nvmlSystemGetCudaDriverVersion_v2", used, &cuda) == NVML_SUCCESS)
    state.cuda_driver_version = cuda;

  unsigned count = 0;
  nvmlReturn_t code = call_newest(nvml.device_count, "nvmlDeviceGetCount_v2", used, &count);
  LOCKSTEP_CHECK(code == NVML_SUCCESS) << used << " failed: " << nvml.error_text(code) << " (NVML library "
                                       << library_->path << "); `nvidia-smi` should show the same problem";
  std::vector<nvmlDevice_t> handles(count);
  std::vector<nvmlPciInfo_t> pci(count);
  for (unsigned i = 0; i < count; ++i) {
    code = call_newest(nvml.handle_by_index, "nvmlDeviceGetHandleByIndex_v2", used, i, &handles[i]);
    LOCKSTEP_CHECK(code == NVML_SUCCESS) << used << "(" << i << ") failed: " << nvml.error_text(code)
                                         << " (NVML library " << library_->path
                                         << "); a GPU that fails here is often lost or needs a reset: see `nvidia-smi`";
  }
  for (unsigned i = 0; i < count; ++i) {
    GpuDevice device;
    device.index = i;
    DeviceReader reader(nvml, handles[i], device);
    reader.read_identity(pci[i]);
    reader.read_memory();
    reader.read_readings();
    reader.read_health();
    {
      const std::lock_guard lock(library_->gpm_mutex);
      reader.read_gpm(library_->gpm_previous[i]);
    }
    if (query.processes) reader.read_processes();
    state.devices.push_back(std::move(device));
  }
  if (query.topology) state.topology = read_topology(nvml, handles, pci, state.devices);
  return state;
}

}  // namespace lockstep::gpu
