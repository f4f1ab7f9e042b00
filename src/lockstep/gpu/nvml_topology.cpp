#include "lockstep/gpu/nvml_topology.h"

#include <algorithm>

namespace lockstep::gpu {

namespace {

bool same_pci_device(const nvmlPciInfo_t& a, const nvmlPciInfo_t& b) {
  return a.domain == b.domain && a.bus == b.bus && a.device == b.device;
}

GpuLink link_of(nvmlGpuTopologyLevel_t level) {
  switch (level) {
    case NVML_TOPOLOGY_INTERNAL:  // two GPUs on one board (K80-style): behind one switch
    case NVML_TOPOLOGY_SINGLE:
      return GpuLink::kPix;
    case NVML_TOPOLOGY_MULTIPLE:
      return GpuLink::kPxb;
    case NVML_TOPOLOGY_HOSTBRIDGE:
      return GpuLink::kPhb;
    case NVML_TOPOLOGY_NODE:
      return GpuLink::kNode;
    case NVML_TOPOLOGY_SYSTEM:
      return GpuLink::kSys;
  }
  return GpuLink::kSys;
}

// Active NVLinks of device i: how many go straight to each other GPU, and how many to NVSwitches.
struct NvlinkCounts {
  std::vector<unsigned> to_gpu;
  unsigned to_switch = 0;
};

NvlinkCounts count_nvlinks(const NvmlFunctions& nvml, nvmlDevice_t handle, const std::vector<nvmlPciInfo_t>& pci) {
  NvlinkCounts counts;
  counts.to_gpu.assign(pci.size(), 0);
  if (!nvml.nvlink_state) return counts;
  for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
    // GPUs without NVLink, and links past the GPU's last, answer an error: not a problem.
    nvmlEnableState_t active = NVML_FEATURE_DISABLED;
    if (nvml.nvlink_state.fn(handle, link, &active) != NVML_SUCCESS || active != NVML_FEATURE_ENABLED) continue;
    if (nvml.nvlink_remote_type) {
      nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
      if (nvml.nvlink_remote_type.fn(handle, link, &type) == NVML_SUCCESS && type == NVML_NVLINK_DEVICE_TYPE_SWITCH) {
        ++counts.to_switch;
        continue;
      }
    }
    nvmlPciInfo_t remote{};
    const char* used = "";
    if (call_newest(nvml.nvlink_remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2", used, handle, link, &remote) !=
        NVML_SUCCESS)
      continue;
    for (size_t j = 0; j < pci.size(); ++j) {
      if (same_pci_device(remote, pci[j])) ++counts.to_gpu[j];
    }
  }
  return counts;
}

}  // namespace

std::vector<std::vector<GpuPath>> read_topology(const NvmlFunctions& nvml, const std::vector<nvmlDevice_t>& handles,
                                                const std::vector<nvmlPciInfo_t>& pci,
                                                std::vector<GpuDevice>& devices) {
  const size_t n = handles.size();
  std::vector<NvlinkCounts> nvlinks;
  for (size_t i = 0; i < n; ++i) nvlinks.push_back(count_nvlinks(nvml, handles[i], pci));

  if (!nvml.common_ancestor) {
    for (auto& device : devices)
      device.unavailable.push_back("nvmlDeviceGetTopologyCommonAncestor: not exported by this NVML library");
  }

  std::vector<std::vector<GpuPath>> paths(n, std::vector<GpuPath>(n));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      GpuPath& path = paths[i][j];
      if (i == j) {
        path.link = GpuLink::kSelf;
        continue;
      }
      // Through NVSwitch every GPU reaches every other with all its switch links (NVSwitch
      // systems connect all switches), as nvidia-smi reports it: NV12 on DGX A100.
      unsigned links = nvlinks[i].to_gpu[j];
      if (nvlinks[i].to_switch > 0 && nvlinks[j].to_switch > 0)
        links += std::min(nvlinks[i].to_switch, nvlinks[j].to_switch);
      if (links > 0) {
        path.link = GpuLink::kNvlink;
        path.nvlinks = links;
        continue;
      }
      if (!nvml.common_ancestor) continue;  // noted once per device above
      nvmlGpuTopologyLevel_t level = NVML_TOPOLOGY_SYSTEM;
      nvmlReturn_t code = nvml.common_ancestor.fn(handles[i], handles[j], &level);
      if (code != NVML_SUCCESS) {
        devices[i].unavailable.push_back("nvmlDeviceGetTopologyCommonAncestor(" + std::to_string(i) + ", " +
                                         std::to_string(j) + "): " + nvml.error_text(code));
        continue;
      }
      path.link = link_of(level);
    }
  }
  return paths;
}

}  // namespace lockstep::gpu
