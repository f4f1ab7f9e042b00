#include "tools/common/byte_size.h"

#include <cstdio>

#include "lockstep/core/error.h"
#include "lockstep/core/memory_size.h"

namespace lockstep::tools {

uint64_t parse_byte_size(const std::string& text, const std::string& flag) {
  const std::optional<int64_t> bytes = memory_size(text);
  if (!bytes) throw UsageError(flag + " takes a size like 10G, 512M, 1.5GiB or a byte count; got '" + text + "'");
  return static_cast<uint64_t>(*bytes);
}

std::string format_bytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  // Whole numbers and large values without a decimal: "64 MiB", "80 GiB", "1.5 GiB".
  const bool whole = unit == 0 || value >= 100 || value == static_cast<double>(static_cast<uint64_t>(value));
  char text[32];
  std::snprintf(text, sizeof(text), whole ? "%.0f %s" : "%.1f %s", value, kUnits[unit]);
  return text;
}

}  // namespace lockstep::tools
