#include "tools/common/duration.h"

#include <charconv>
#include <cmath>

#include "lockstep/core/error.h"

namespace lockstep::tools {

double parse_duration(const std::string& flag, const std::string& text) {
  const auto fail = [&] {
    throw UsageError("--" + flag + " " + text + " is not a duration: give seconds (90, 90s), minutes (10m) or hours " +
                     "(1.5h), more than 0");
  };
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [unit, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || !std::isfinite(value) || !(value > 0)) fail();
  const std::string suffix(unit, end);
  if (suffix.empty() || suffix == "s") return value;
  if (suffix == "m") return value * 60;
  if (suffix == "h") return value * 3600;
  fail();
  return 0;
}

}  // namespace lockstep::tools
