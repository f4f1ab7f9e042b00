#include "tools/common/path_lookup.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

namespace lockstep::tools {
namespace {

bool is_executable_file(const std::filesystem::path& candidate) {
  std::error_code error;
  return access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate, error);
}

}  // namespace

std::string find_on_path(const std::string& path_env, const std::string& program) {
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) return is_executable_file(program) ? program : "";
  if (path_env.empty()) return "";
  for (size_t start = 0; start <= path_env.size();) {
    const size_t end = std::min(path_env.find(':', start), path_env.size());
    // An empty entry is the current folder, as POSIX shells read PATH.
    const std::string dir = end > start ? path_env.substr(start, end - start) : ".";
    start = end + 1;
    const std::filesystem::path candidate = std::filesystem::path(dir) / program;
    if (is_executable_file(candidate)) return candidate.string();
  }
  return "";
}

}  // namespace lockstep::tools
