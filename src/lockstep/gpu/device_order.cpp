#include "lockstep/gpu/device_order.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <tuple>

namespace lockstep::gpu {

namespace {

// (domain, bus, device, function) of "00000000:07:00.0"; unparsable ids sort last.
std::tuple<unsigned, unsigned, unsigned, unsigned> pci_key(const std::string& bus_id) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  if (std::sscanf(bus_id.c_str(), "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4) return {~0u, ~0u, ~0u, ~0u};
  return {domain, bus, device, function};
}

std::string trim(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// A plain decimal index, as CUDA reads it; nullopt for anything else ("-1", "1a", "").
std::optional<unsigned> parse_index(const std::string& entry) {
  if (entry.empty() || entry.size() > 9) return std::nullopt;
  for (char c : entry) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  return static_cast<unsigned>(std::stoul(entry));
}

// Resolves one CUDA_VISIBLE_DEVICES entry to an NVML index, or says why it cannot.
std::optional<unsigned> resolve_entry(const GpuState& state, const std::vector<unsigned>& enumeration,
                                      const std::string& entry, std::string& why) {
  if (auto index = parse_index(entry)) {
    if (*index < enumeration.size()) return enumeration[*index];
    why = "there is no GPU " + std::to_string(*index) + " (CUDA numbers " + std::to_string(enumeration.size()) +
          " GPU" + (enumeration.size() == 1 ? "" : "s") + " from 0)";
    return std::nullopt;
  }
  const std::string wanted = lower(entry);
  if (wanted.rfind("mig-", 0) == 0) {
    why = "a MIG instance; lockstep reads whole GPUs only and cannot tell which GPU it is on";
    return std::nullopt;
  }
  if (wanted.rfind("gpu-", 0) == 0) {  // a UUID, or a unique prefix of one
    std::optional<unsigned> match;
    for (const auto& device : state.devices) {
      if (lower(device.uuid).rfind(wanted, 0) != 0) continue;
      if (match) {
        why = "matches more than one GPU's UUID; give more of it";
        return std::nullopt;
      }
      match = device.index;
    }
    if (!match) why = "matches no GPU's UUID (`nvidia-smi -L` lists them)";
    return match;
  }
  why = "is neither an index, a GPU-<uuid> nor a MIG-<uuid>";
  return std::nullopt;
}

}  // namespace

std::vector<unsigned> cuda_enumeration_order(const GpuState& state, bool pci_bus_order) {
  std::vector<const GpuDevice*> devices;
  for (const auto& device : state.devices) devices.push_back(&device);
  auto pci_before = [](const GpuDevice* a, const GpuDevice* b) {
    return pci_key(a->pci_bus_id) < pci_key(b->pci_bus_id);
  };
  if (pci_bus_order) {
    std::stable_sort(devices.begin(), devices.end(), pci_before);
  } else {
    auto speed = [](const GpuDevice* d) {
      return static_cast<uint64_t>(d->multiprocessors.value_or(0)) * d->sm_clock_max_mhz.value_or(0);
    };
    std::stable_sort(devices.begin(), devices.end(), [&](const GpuDevice* a, const GpuDevice* b) {
      auto capability_a = std::make_pair(a->compute_major, a->compute_minor);
      auto capability_b = std::make_pair(b->compute_major, b->compute_minor);
      if (capability_a != capability_b) return capability_a > capability_b;
      if (speed(a) != speed(b)) return speed(a) > speed(b);
      return pci_before(a, b);
    });
  }
  std::vector<unsigned> order;
  for (const GpuDevice* device : devices) order.push_back(device->index);
  return order;
}

bool CudaDevices::enumeration_differs_from_nvml() const {
  for (size_t k = 0; k < enumeration.size(); ++k) {
    if (enumeration[k] != k) return true;
  }
  return false;
}

std::optional<unsigned> CudaDevices::cuda_index(unsigned nvml_index) const {
  auto it = std::find(visible.begin(), visible.end(), nvml_index);
  if (it == visible.end()) return std::nullopt;
  return static_cast<unsigned>(it - visible.begin());
}

CudaDevices cuda_devices(const GpuState& state, const std::optional<std::string>& visible_devices,
                         const std::optional<std::string>& device_order) {
  CudaDevices result;
  if (device_order) {
    const std::string order = trim(*device_order);
    if (order == "PCI_BUS_ID") {
      result.pci_bus_order = true;
    } else if (order != "FASTEST_FIRST" && !order.empty()) {
      result.problems.push_back("CUDA_DEVICE_ORDER=\"" + *device_order +
                                "\" is not PCI_BUS_ID or FASTEST_FIRST; CUDA uses FASTEST_FIRST");
    }
  }
  result.enumeration = cuda_enumeration_order(state, result.pci_bus_order);
  if (result.enumeration_differs_from_nvml()) {
    std::string pairs;
    for (size_t k = 0; k < result.enumeration.size(); ++k) {
      if (result.enumeration[k] == k) continue;
      pairs += (pairs.empty() ? "" : ", ") + std::string("CUDA ") + std::to_string(k) + " is nvidia-smi " +
               std::to_string(result.enumeration[k]);
    }
    result.problems.push_back("CUDA numbers these GPUs differently from nvidia-smi (" + pairs +
                              "); set CUDA_DEVICE_ORDER=PCI_BUS_ID to make the numbers agree");
  }

  if (!visible_devices) {
    result.visible = result.enumeration;
    return result;
  }
  // CUDA reads the list up to the first entry it cannot use and ignores the rest.
  const std::string& list = *visible_devices;
  if (list.empty()) result.problems.push_back("CUDA_VISIBLE_DEVICES is set but empty: CUDA sees no GPU");
  size_t start = 0;
  for (unsigned position = 1; start <= list.size() && !list.empty(); ++position) {
    const size_t comma = list.find(',', start);
    const std::string entry = trim(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    std::string why;
    std::optional<unsigned> nvml_index = resolve_entry(state, result.enumeration, entry, why);
    if (nvml_index && std::find(result.visible.begin(), result.visible.end(), *nvml_index) != result.visible.end()) {
      why = "names nvidia-smi GPU " + std::to_string(*nvml_index) + " a second time";
      nvml_index.reset();
    }
    if (!nvml_index) {
      result.problems.push_back("CUDA_VISIBLE_DEVICES entry " + std::to_string(position) + " (\"" + entry + "\") " +
                                why + "; CUDA ignores it and every entry after it, so " +
                                std::to_string(result.visible.size()) + " GPU" +
                                (result.visible.size() == 1 ? " is" : "s are") + " visible");
      break;
    }
    result.visible.push_back(*nvml_index);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return result;
}

CudaDevices cuda_devices_from_environment(const GpuState& state) {
  auto variable = [](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  };
  return cuda_devices(state, variable("CUDA_VISIBLE_DEVICES"), variable("CUDA_DEVICE_ORDER"));
}

}  // namespace lockstep::gpu
