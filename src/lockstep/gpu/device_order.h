// Which GPU a CUDA program calls "cuda:k". NVML (and nvidia-smi) number GPUs in PCI bus
// order; CUDA numbers them fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and then
// keeps only those CUDA_VISIBLE_DEVICES names, in the order it names them. Tools show both
// numbers and warn where they differ. Pure functions of a GpuState and the variables' values.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lockstep/gpu/gpu_state.h"

namespace lockstep::gpu {

struct CudaDevices {
  bool pci_bus_order = false;         // CUDA_DEVICE_ORDER=PCI_BUS_ID
  std::vector<unsigned> enumeration;  // every GPU in CUDA's order: [k] = NVML index
  std::vector<unsigned> visible;      // [CUDA index] = NVML index, after CUDA_VISIBLE_DEVICES
  // Printable, one line each: an entry of CUDA_VISIBLE_DEVICES that stopped the list, an
  // unknown CUDA_DEVICE_ORDER, CUDA's numbering differing from nvidia-smi's.
  std::vector<std::string> problems;

  // CUDA would number the GPUs differently from NVML even with every GPU visible.
  bool enumeration_differs_from_nvml() const;
  // The CUDA index of an NVML GPU, or nullopt when CUDA_VISIBLE_DEVICES hides it.
  std::optional<unsigned> cuda_index(unsigned nvml_index) const;
};

// `visible_devices` and `device_order` are the variables' values, nullopt when unset.
CudaDevices cuda_devices(const GpuState& state, const std::optional<std::string>& visible_devices,
                         const std::optional<std::string>& device_order);
// The same, with CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER read from this process's environment.
CudaDevices cuda_devices_from_environment(const GpuState& state);

// CUDA's enumeration order before CUDA_VISIBLE_DEVICES: PCI bus order, or FASTEST_FIRST.
// FASTEST_FIRST is the driver's heuristic, not documented beyond "fastest first"; this
// approximates it as higher compute capability first, then more SMs x max SM clock, ties
// in PCI bus order. Identical GPUs therefore keep PCI order, as they do under CUDA.
std::vector<unsigned> cuda_enumeration_order(const GpuState& state, bool pci_bus_order);

}  // namespace lockstep::gpu
