// How each pair of GPUs reaches the other, read from NVML the way `nvidia-smi topo -m`
// shows it: NVLink connections first (direct, or through NVSwitch), else the closest PCIe
// ancestor the two share.
#pragma once

#include <string>
#include <vector>

#include "lockstep/gpu/gpu_state.h"
#include "lockstep/gpu/nvml_functions.h"

namespace lockstep::gpu {

// [i][j] for the devices whose handles and PCI addresses are given (NVML order). Pairs NVML
// cannot place stay kSys (the pessimistic guess) and the failed call is noted in device i's
// `unavailable`.
std::vector<std::vector<GpuPath>> read_topology(const NvmlFunctions& nvml, const std::vector<nvmlDevice_t>& handles,
                                                const std::vector<nvmlPciInfo_t>& pci, std::vector<GpuDevice>& devices);

}  // namespace lockstep::gpu
