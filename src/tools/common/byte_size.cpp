#include "tools/common/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "lockstep/core/error.h"

namespace lockstep::tools {

uint64_t parse_byte_size(const std::string& text, const std::string& flag) {
  const auto bad = [&] {
    return UsageError(flag + " takes a size like 10G, 512M, 1.5GiB or a byte count; got '" + text + "'");
  };
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !std::isfinite(number) || number < 0 ||
      !std::isdigit(static_cast<unsigned char>(text[0]))) {
    throw bad();
  }
  std::string suffix(end);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.size() > 1 && (suffix.ends_with("IB") || suffix.ends_with("B"))) {
    suffix.resize(suffix.size() - (suffix.ends_with("IB") ? 2 : 1));
  } else if (suffix == "B") {
    suffix.clear();
  }
  int shift = 0;
  if (suffix == "K") {
    shift = 10;
  } else if (suffix == "M") {
    shift = 20;
  } else if (suffix == "G") {
    shift = 30;
  } else if (suffix == "T") {
    shift = 40;
  } else if (!suffix.empty()) {
    throw bad();
  }
  const double bytes = std::ldexp(number, shift);
  if (bytes >= 0x1p63) throw bad();
  return static_cast<uint64_t>(std::llround(bytes));
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
