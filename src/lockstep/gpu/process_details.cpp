#include "lockstep/gpu/process_details.h"

#include <pwd.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace lockstep::gpu {

namespace {

// The real uid: the first number of the "Uid:" line of /proc/<pid>/status.
bool read_uid(const std::string& status_path, uint32_t& uid) {
  std::ifstream status(status_path);
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Uid:", 0) != 0) continue;
    std::istringstream fields(line.substr(4));
    unsigned long value = 0;
    if (!(fields >> value)) return false;
    uid = static_cast<uint32_t>(value);
    return true;
  }
  return false;
}

std::string user_name(uint32_t uid) {
  long size = sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buffer(size > 0 ? static_cast<size_t>(size) : 16384);
  passwd entry{};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &found) != 0 || found == nullptr) return "";
  return found->pw_name;
}

// /proc/<pid>/cmdline holds the arguments separated (and ended) by NUL bytes. A process
// that exits while it is read fails the read (ESRCH), which libstdc++ throws: no command.
std::string command_line(const std::string& cmdline_path) {
  std::ifstream file(cmdline_path, std::ios::binary);
  std::string raw;
  try {
    raw.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  } catch (const std::exception&) {
    return "";
  }
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  for (char& c : raw) {
    if (c == '\0') c = ' ';
  }
  return raw;
}

}  // namespace

void fill_process_details(GpuProcess& process, const std::string& proc_root) {
  const std::string dir = proc_root + "/" + std::to_string(process.pid);
  uint32_t uid = 0;
  if (!read_uid(dir + "/status", uid)) {
    process.in_this_namespace = false;
    return;
  }
  process.in_this_namespace = true;
  process.uid = uid;
  process.user = user_name(uid);
  process.command = command_line(dir + "/cmdline");
}

}  // namespace lockstep::gpu
