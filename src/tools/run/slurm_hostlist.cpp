#include "tools/run/slurm_hostlist.h"

#include "lockstep/core/error.h"

namespace lockstep::tools {

std::string first_slurm_host(const std::string& list, const std::string& variable) {
  std::string host;
  for (size_t i = 0; i < list.size() && list[i] != ','; ++i) {
    if (list[i] != '[') {
      if (list[i] == ']') break;
      host += list[i];
      continue;
    }
    // A bracket of ranges and numbers: its first element's first number, zeros kept.
    const size_t close = list.find(']', i);
    if (close == std::string::npos) {
      throw UsageError(variable + "='" + list.substr(0, 80) + "' has a '[' without its ']'");
    }
    const std::string first = list.substr(i + 1, list.find_first_of(",-]", i + 1) - i - 1);
    if (first.empty()) throw UsageError(variable + "='" + list.substr(0, 80) + "' has an empty range");
    host += first;
    i = close;
  }
  if (host.empty()) throw UsageError(variable + "='" + list.substr(0, 80) + "' names no host");
  return host;
}

}  // namespace lockstep::tools
