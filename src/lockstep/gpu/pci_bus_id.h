// PCI bus ids as NVML, the NVIDIA driver's files and nvidia-smi spell them, made comparable.
#pragma once

#include <string>

namespace lockstep::gpu {

// "00000000:07:00.0" (NVML) and "0000:07:00.0" (the driver's folder names) both become
// "0000:07:00.0", lower case, so the two lists can be compared.
std::string normalize_pci_bus_id(const std::string& bus_id);

}  // namespace lockstep::gpu
