#include "tools/doctor/host_facts.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lockstep/gpu/pci_bus_id.h"
#include "tools/common/path_lookup.h"

namespace lockstep::tools {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

// The value after "Key:" in the driver's "Key:   value" files.
std::string field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return trim(line.substr(key.size() + 1));
  }
  return "";
}

// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Tue Oct 10 ..." → "535.129.03"
std::string module_version(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  const auto at = line.find("Kernel Module");
  if (at == std::string::npos) return "";
  std::istringstream words(line.substr(at + 13));
  std::string word;
  while (words >> word) {
    if (std::isdigit(static_cast<unsigned char>(word[0])) && word.find('.') != std::string::npos) return word;
  }
  return "";
}

bool all_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

int count_cpulist(const std::string& cpulist) {
  const std::string text = trim(cpulist);
  if (text.empty()) return 0;
  int count = 0;
  std::istringstream in(text);
  for (std::string range; std::getline(in, range, ',');) {
    const auto dash = range.find('-');
    const std::string first = range.substr(0, dash);
    const std::string last = dash == std::string::npos ? first : range.substr(dash + 1);
    if (!all_digits(first) || !all_digits(last) || first.size() > 6 || last.size() > 6) return -1;
    const int a = std::stoi(first), b = std::stoi(last);
    if (b < a) return -1;
    count += b - a + 1;
  }
  return count;
}

HostFacts gather_host_facts(const HostProbe& probe) {
  HostFacts facts;
  const fs::path root = probe.root.empty() ? fs::path("/") : fs::path(probe.root);
  auto under = [&](const std::string& absolute) { return root / fs::path(absolute).relative_path(); };
  std::error_code error;

  struct statvfs shm {};
  const fs::path shm_path = under(probe.shm_path);
  if (fs::is_directory(shm_path, error) && statvfs(shm_path.c_str(), &shm) == 0) {
    facts.shm_present = true;
    facts.shm_total_bytes = static_cast<uint64_t>(shm.f_blocks) * shm.f_frsize;
    facts.shm_free_bytes = static_cast<uint64_t>(shm.f_bavail) * shm.f_frsize;
  }

  struct rlimit memlock {};
  if (getrlimit(RLIMIT_MEMLOCK, &memlock) == 0 && memlock.rlim_cur != RLIM_INFINITY) {
    facts.memlock_bytes = memlock.rlim_cur;
  }

  facts.cores_online = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  cpu_set_t set;
  facts.cores_allowed = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : facts.cores_online;

  for (const auto& entry : fs::directory_iterator(under("/sys/devices/system/node"), error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) != 0 || !all_digits(name.substr(4))) continue;
    NumaNode node;
    node.id = std::stoi(name.substr(4));
    node.cpulist = trim(read_text(entry.path() / "cpulist"));
    node.cpus = std::max(0, count_cpulist(node.cpulist));
    facts.numa_nodes.push_back(node);
  }
  std::sort(facts.numa_nodes.begin(), facts.numa_nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });

  for (const auto& entry : fs::directory_iterator(under("/sys/class/infiniband"), error)) {
    facts.infiniband_devices.push_back(entry.path().filename().string());
  }
  std::sort(facts.infiniband_devices.begin(), facts.infiniband_devices.end());

  facts.mpirun_path = find_on_path(probe.path_env, "mpirun");

  facts.driver_module_version = module_version(read_text(under("/proc/driver/nvidia/version")));
  for (const auto& entry : fs::directory_iterator(under("/proc"), error)) {
    const std::string pid = entry.path().filename().string();
    if (all_digits(pid) && trim(read_text(entry.path() / "comm")) == "nv-fabricmanager") {
      facts.fabric_manager_running = true;
      break;
    }
  }
  for (const auto& entry : fs::directory_iterator(under("/proc/driver/nvidia/gpus"), error)) {
    DriverGpu gpu;
    const std::string information = read_text(entry.path() / "information");
    const std::string location = field(information, "Bus Location");
    gpu.pci_bus_id = gpu::normalize_pci_bus_id(location.empty() ? entry.path().filename().string() : location);
    gpu.model = field(information, "Model");
    facts.driver_gpus.push_back(gpu);
  }
  std::sort(facts.driver_gpus.begin(), facts.driver_gpus.end(),
            [](const DriverGpu& a, const DriverGpu& b) { return a.pci_bus_id < b.pci_bus_id; });

  for (const auto& entry : fs::directory_iterator(under("/dev"), error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("nvidia", 0) == 0 && all_digits(name.substr(6))) facts.device_nodes.push_back("/dev/" + name);
  }
  std::sort(facts.device_nodes.begin(), facts.device_nodes.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  return facts;
}

}  // namespace lockstep::tools
