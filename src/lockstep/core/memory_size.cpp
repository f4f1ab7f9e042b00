#include "lockstep/core/memory_size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

namespace lockstep {

std::optional<int64_t> memory_size(const std::string& text) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  if (!std::isfinite(number)) return std::nullopt;
  std::string suffix(end);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = -1;
  if (suffix.empty() || suffix == "B") shift = 0;
  int prefix_shift = 0;
  for (const char* prefix : {"K", "M", "G", "T"}) {
    prefix_shift += 10;
    for (const char* tail : {"", "B", "IB"}) {
      if (suffix == std::string(prefix) + tail) shift = prefix_shift;
    }
  }
  if (shift < 0) return std::nullopt;
  const double bytes = std::ldexp(number, shift);
  if (bytes >= 0x1p63) return std::nullopt;
  return static_cast<int64_t>(std::llround(bytes));
}

}  // namespace lockstep
