#include "lockstep/core/device_memory_limit.h"

#include <cstdlib>
#include <optional>

#include "lockstep/core/error.h"
#include "lockstep/core/memory_size.h"

namespace lockstep {

int64_t parse_memory_size(const char* text, const char* variable) {
  const std::optional<int64_t> bytes = memory_size(text);
  LOCKSTEP_CHECK(bytes.has_value())
      << variable << "='" << text
      << "' is not a size: give bytes, or a number with K, M, G or T (binary: 512M, 1.5GiB), or 0 for no limit";
  return *bytes;
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
