#include "lockstep/gpu/pci_bus_id.h"

#include <algorithm>
#include <cctype>

namespace lockstep::gpu {

std::string normalize_pci_bus_id(const std::string& bus_id) {
  std::string lower = bus_id;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  const auto colon = lower.find(':');
  // Only "domain:bus:device.function" has two colons; the domain is cut to its last 4 digits.
  if (colon == std::string::npos || lower.find(':', colon + 1) == std::string::npos) return lower;
  std::string domain = lower.substr(0, colon);
  if (domain.size() > 4) domain = domain.substr(domain.size() - 4);
  while (domain.size() < 4) domain = "0" + domain;
  return domain + lower.substr(colon);
}

}  // namespace lockstep::gpu
