#include "lockstep/core/device_memory_limit.h"

#include <cctype>
#include <cstdlib>
#include <string>

#include "lockstep/core/error.h"

namespace lockstep {

int64_t parse_memory_size(const char* text, const char* variable) {
  char* end = nullptr;
  const double number = std::strtod(text, &end);
  std::string suffix(end);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = suffix.empty() || suffix == "B" ? 1 : 0;
  double unit = 1;
  for (const char* prefix : {"K", "M", "G", "T"}) {
    unit *= 1024;
    for (const char* tail : {"", "B", "IB"}) {
      if (suffix == std::string(prefix) + tail) scale = unit;
    }
  }
  LOCKSTEP_CHECK(end != text && number >= 0 && number * scale < 9.2e18 && scale > 0)
      << variable << "='" << text
      << "' is not a size: give bytes, or a number with K, M, G or T (binary: 512M, 1.5GiB), or 0 for no limit";
  return static_cast<int64_t>(number * scale);
}

int64_t DeviceMemoryLimit::bytes() {
  int64_t bytes = bytes_.load(std::memory_order_relaxed);
  if (bytes < 0) {
    const char* text = std::getenv(variable_);
    bytes = text == nullptr || *text == '\0' ? 0 : parse_memory_size(text, variable_);
    int64_t unread = -1;
    if (!bytes_.compare_exchange_strong(unread, bytes)) bytes = unread;  // a setter came first
  }
  return bytes;
}

void DeviceMemoryLimit::set(int64_t bytes) {
  LOCKSTEP_CHECK(bytes >= 0) << "a device memory limit must be 0 (none) or positive, got " << bytes;
  bytes_.store(bytes);
}

}  // namespace lockstep
