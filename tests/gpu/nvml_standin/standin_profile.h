// The machine the NVML stand-in pretends to be: a profile file (JSON, see
// docs/nvml-standin.md) read at nvmlInit. Readings may be arrays that cycle one step per
// call, so a monitor sees movement; any field the profile leaves out answers
// NVML_ERROR_NOT_SUPPORTED, as a real driver does for what a GPU lacks.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/gpu/nvml_abi.h"

namespace nvml_standin {

struct Link {
  nvmlIntNvLinkDeviceType_t remote_type = NVML_NVLINK_DEVICE_TYPE_GPU;
  nvmlPciInfo_t remote{};
};

struct Process {
  unsigned pid = 0;
  unsigned long long used = NVML_VALUE_NOT_AVAILABLE;
};

struct Device {
  unsigned index = 0;
  nlohmann::json fields;  // the profile's device object, merged over "defaults"
  nvmlPciInfo_t pci{};
  std::vector<Process> processes;
  std::vector<Link> links;  // NVLinks 0..n-1, all active
  std::map<std::string, nvmlReturn_t> fail;
  std::map<std::string, size_t> calls;  // per field: how many readings were taken (cycling arrays)

  // The next value of the field at JSON pointer `path`, or false when the profile has none.
  bool take(const std::string& path, uint64_t& value);
};

struct Profile {
  std::string driver_version, nvml_version;
  int cuda_driver_version = 0;
  std::vector<Device> devices;
  std::vector<std::vector<std::string>> topology;  // "X", "NV12", "PIX", ... ; empty when not given
  std::map<std::string, nvmlReturn_t> fail;        // for every device and the system calls

  // The code `function` is told to fail with on `device` (nullptr: system calls), or NVML_SUCCESS.
  nvmlReturn_t failure(const std::string& function, const Device* device) const;
};

// Reads the file; throws std::runtime_error saying what is wrong with it.
Profile load_profile(const std::string& path);

// "NVML_ERROR_UNKNOWN" or a number as JSON -> the code.
nvmlReturn_t return_code(const nlohmann::json& value);
// The text NVIDIA's nvmlErrorString gives for a code.
const char* error_string(nvmlReturn_t code);

}  // namespace nvml_standin
