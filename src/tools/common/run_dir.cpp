#include "tools/common/run_dir.h"

#include <ctime>
#include <filesystem>

namespace lockstep::tools {

std::string fresh_run_dir(const std::string& prefix) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &local);
  const std::string base = "runs/" + prefix + stamp;
  std::string dir = base;
  for (int i = 2; std::filesystem::exists(dir); ++i) dir = base + "-" + std::to_string(i);
  return dir;
}

}  // namespace lockstep::tools
