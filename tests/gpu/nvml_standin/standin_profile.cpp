#include "standin_profile.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace nvml_standin {

namespace {

struct CodeName {
  nvmlReturn_t code;
  const char* name;
  const char* text;  // nvmlErrorString's
};

constexpr CodeName kCodes[] = {
    {NVML_SUCCESS, "NVML_SUCCESS", "Success"},
    {NVML_ERROR_UNINITIALIZED, "NVML_ERROR_UNINITIALIZED", "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "NVML_ERROR_INVALID_ARGUMENT", "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "NVML_ERROR_NOT_SUPPORTED", "Not Supported"},
    {NVML_ERROR_NO_PERMISSION, "NVML_ERROR_NO_PERMISSION", "Insufficient Permissions"},
    {NVML_ERROR_ALREADY_INITIALIZED, "NVML_ERROR_ALREADY_INITIALIZED", "Already Initialized"},
    {NVML_ERROR_NOT_FOUND, "NVML_ERROR_NOT_FOUND", "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "NVML_ERROR_INSUFFICIENT_SIZE", "Insufficient Size"},
    {NVML_ERROR_INSUFFICIENT_POWER, "NVML_ERROR_INSUFFICIENT_POWER", "Insufficient External Power"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "NVML_ERROR_DRIVER_NOT_LOADED", "Driver Not Loaded"},
    {NVML_ERROR_TIMEOUT, "NVML_ERROR_TIMEOUT", "Timeout"},
    {NVML_ERROR_IRQ_ISSUE, "NVML_ERROR_IRQ_ISSUE", "Interrupt Request Issue"},
    {NVML_ERROR_LIBRARY_NOT_FOUND, "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"},
    {NVML_ERROR_FUNCTION_NOT_FOUND, "NVML_ERROR_FUNCTION_NOT_FOUND", "Function Not Found"},
    {NVML_ERROR_CORRUPTED_INFOROM, "NVML_ERROR_CORRUPTED_INFOROM", "Corrupted infoROM"},
    {NVML_ERROR_GPU_IS_LOST, "NVML_ERROR_GPU_IS_LOST", "GPU is lost"},
    {NVML_ERROR_RESET_REQUIRED, "NVML_ERROR_RESET_REQUIRED", "GPU requires reset"},
    {NVML_ERROR_OPERATING_SYSTEM, "NVML_ERROR_OPERATING_SYSTEM", "GPU access blocked by the operating system"},
    {NVML_ERROR_LIB_RM_VERSION_MISMATCH, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", "Driver/library version mismatch"},
    {NVML_ERROR_IN_USE, "NVML_ERROR_IN_USE", "In use by another client"},
    {NVML_ERROR_MEMORY, "NVML_ERROR_MEMORY", "Insufficient Memory"},
    {NVML_ERROR_NO_DATA, "NVML_ERROR_NO_DATA", "No data"},
    {NVML_ERROR_INSUFFICIENT_RESOURCES, "NVML_ERROR_INSUFFICIENT_RESOURCES", "Insufficient Resources"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
     "Version mismatch between the argument and the API"},
    {NVML_ERROR_UNKNOWN, "NVML_ERROR_UNKNOWN", "Unknown Error"},
};

// "00000000:07:00.0" -> domain, bus, device (and both bus id strings).
nvmlPciInfo_t parse_bus_id(const std::string& text) {
  nvmlPciInfo_t pci{};
  unsigned function = 0;
  if (std::sscanf(text.c_str(), "%x:%x:%x.%x", &pci.domain, &pci.bus, &pci.device, &function) != 4)
    throw std::runtime_error("bad PCI bus id \"" + text + "\": want DOMAIN:BUS:DEVICE.FUNCTION in hex");
  std::snprintf(pci.busId, sizeof pci.busId, "%s", text.c_str());
  std::snprintf(pci.busIdLegacy, sizeof pci.busIdLegacy, "%04X:%02X:%02X.%X", pci.domain & 0xffff, pci.bus, pci.device,
                function);
  return pci;
}

uint64_t number(const nlohmann::json& value) {
  if (value.is_boolean()) return value.get<bool>() ? 1 : 0;
  if (value.is_string()) return std::stoull(value.get<std::string>(), nullptr, 0);  // "0x44"
  return value.get<uint64_t>();
}

std::map<std::string, nvmlReturn_t> fail_map(const nlohmann::json& object) {
  std::map<std::string, nvmlReturn_t> fail;
  if (object.contains("fail"))
    for (const auto& [function, code] : object["fail"].items()) fail[function] = return_code(code);
  return fail;
}

unsigned nvlink_count(const std::string& entry) {
  return entry.rfind("NV", 0) == 0 ? static_cast<unsigned>(std::stoul(entry.substr(2))) : 0;
}

// NVLinks from the topology matrix: NV<k> between i and j gives each k links to the other,
// or, on an NVSwitch system, k links to the switches.
void build_links(Profile& profile, bool nvswitch) {
  for (auto& device : profile.devices) {
    const auto& row = profile.topology[device.index];
    if (nvswitch) {
      unsigned links = 0;
      for (const auto& entry : row) links = std::max(links, nvlink_count(entry));
      for (unsigned link = 0; link < links; ++link) {
        Link to_switch;
        to_switch.remote_type = NVML_NVLINK_DEVICE_TYPE_SWITCH;
        char bus_id[32];
        std::snprintf(bus_id, sizeof bus_id, "00000000:%02X:00.0", 0xC4 + link % 6);
        to_switch.remote = parse_bus_id(bus_id);
        device.links.push_back(to_switch);
      }
      continue;
    }
    for (size_t j = 0; j < row.size(); ++j) {
      for (unsigned k = 0; k < nvlink_count(row[j]); ++k) {
        Link to_gpu;
        to_gpu.remote = profile.devices[j].pci;
        device.links.push_back(to_gpu);
      }
    }
    if (device.links.size() > NVML_NVLINK_MAX_LINKS)
      throw std::runtime_error("device " + std::to_string(device.index) + " has more NVLinks than NVML's " +
                               std::to_string(NVML_NVLINK_MAX_LINKS));
  }
}

}  // namespace

bool Device::take(const std::string& path, uint64_t& value) {
  const nlohmann::json::json_pointer pointer(path);
  if (!fields.contains(pointer) || fields.at(pointer).is_null()) return false;
  const auto& field = fields.at(pointer);
  if (field.is_array()) {
    if (field.empty()) return false;
    value = number(field.at(calls[path]++ % field.size()));
  } else {
    value = number(field);
  }
  return true;
}

nvmlReturn_t Profile::failure(const std::string& function, const Device* device) const {
  if (device != nullptr) {
    auto it = device->fail.find(function);
    if (it != device->fail.end()) return it->second;
  }
  auto it = fail.find(function);
  return it != fail.end() ? it->second : NVML_SUCCESS;
}

nvmlReturn_t return_code(const nlohmann::json& value) {
  if (value.is_number_integer()) return static_cast<nvmlReturn_t>(value.get<int>());
  const std::string name = value.get<std::string>();
  for (const auto& code : kCodes) {
    if (name == code.name) return code.code;
  }
  throw std::runtime_error("unknown NVML return code \"" + name + "\"");
}

const char* error_string(nvmlReturn_t code) {
  for (const auto& known : kCodes) {
    if (known.code == code) return known.text;
  }
  return "Unknown Error";
}

Profile load_profile(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot open " + path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + " is not valid JSON: " + e.what());
  }
  Profile profile;
  profile.driver_version = json.value("driver_version", "");
  profile.nvml_version = json.value("nvml_version", "");
  profile.cuda_driver_version = json.value("cuda_driver_version", 0);
  profile.fail = fail_map(json);
  const nlohmann::json defaults = json.value("defaults", nlohmann::json::object());
  for (const auto& entry : json.value("devices", nlohmann::json::array())) {
    Device device;
    device.index = static_cast<unsigned>(profile.devices.size());
    device.fields = defaults;
    device.fields.merge_patch(entry);
    device.pci = parse_bus_id(device.fields.value("pci_bus_id", "00000000:00:00.0"));
    device.fail = fail_map(device.fields);
    for (const auto& process : device.fields.value("processes", nlohmann::json::array())) {
      Process p;
      const auto& pid = process.at("pid");
      p.pid =
          pid.is_string() && pid.get<std::string>() == "self" ? static_cast<unsigned>(getpid()) : pid.get<unsigned>();
      if (process.contains("used_memory") && !process["used_memory"].is_null())
        p.used = process["used_memory"].get<unsigned long long>();
      device.processes.push_back(p);
    }
    profile.devices.push_back(std::move(device));
  }
  if (json.contains("topology")) {
    profile.topology = json["topology"].get<std::vector<std::vector<std::string>>>();
    if (profile.topology.size() != profile.devices.size())
      throw std::runtime_error(path + ": the topology matrix must have one row per device");
    for (const auto& row : profile.topology) {
      if (row.size() != profile.devices.size())
        throw std::runtime_error(path + ": every topology row must have one entry per device");
    }
    build_links(profile, json.value("nvswitch", false));
  }
  return profile;
}

}  // namespace nvml_standin
