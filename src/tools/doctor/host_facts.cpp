#include "tools/doctor/host_facts.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lockstep/gpu/pci_bus_id.h"
#include "tools/common/path_lookup.h"

namespace lockstep::tools {
namespace {

namespace fs = std::filesystem;

// A file that cannot be read reads as empty, as a missing one does. /proc/<pid>/ files of a
// process that exits between listing and reading fail the read with ESRCH (and a PCI
// device's config space may fail with EIO), which libstdc++'s stream buffer throws as an
// exception rather than setting a flag.
std::string read_file(const fs::path& path, std::ios::openmode mode) {
  std::ifstream in(path, mode);
  try {
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  } catch (const std::exception&) {
    return "";
  }
}

std::string read_text(const fs::path& path) { return read_file(path, std::ios::in); }

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

// /dev/kmsg hands out one record per read(), and with O_NONBLOCK says EAGAIN after the last
// one instead of waiting for the next; EPIPE means records were overwritten while reading,
// and reading goes on with the oldest left. A fake log in tests is a regular file of lines.
void read_kernel_log(const fs::path& path, HostFacts& facts) {
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;
  struct stat info {};
  const bool records = fstat(fd, &info) == 0 && S_ISCHR(info.st_mode);
  std::string text;                               // a regular file's whole text
  std::vector<char> buffer(16384);                // above the kernel's 8 KiB limit on one record
  constexpr size_t kMaxBytes = size_t{64} << 20;  // a log that keeps growing while read ends here
  size_t total = 0;
  while (total < kMaxBytes) {
    const ssize_t n = read(fd, buffer.data(), buffer.size());
    if (n < 0 && (errno == EINTR || (records && errno == EPIPE))) continue;
    if (n <= 0) {
      facts.kernel_log_read = n == 0 || errno == EAGAIN;
      break;
    }
    total += static_cast<size_t>(n);
    if (!records) {
      text.append(buffer.data(), static_cast<size_t>(n));
      continue;
    }
    // A record is "prefix;message\n", then its dictionary (" SUBSYSTEM=pci", …) on more lines.
    std::string_view record(buffer.data(), static_cast<size_t>(n));
    gpu::XidEvent event;
    if (gpu::parse_xid_line(record.substr(0, record.find('\n')), event)) facts.xid_events.push_back(std::move(event));
  }
  if (total >= kMaxBytes) facts.kernel_log_read = true;
  close(fd);
  if (!records) facts.xid_events = gpu::parse_xid_log(text);
}

bool is_iommu_word(const std::string& word) {
  for (const char* key : {"intel_iommu=", "amd_iommu=", "iommu=", "iommu.passthrough="}) {
    if (word.rfind(key, 0) == 0) return true;
  }
  return false;
}

void read_iommu(const fs::path& root, HostFacts& facts) {
  std::error_code error;
  std::ifstream cmdline(root / "proc/cmdline");
  facts.kernel_cmdline_read = cmdline.is_open();
  for (std::string word; cmdline >> word;) {
    if (is_iommu_word(word)) facts.iommu_cmdline.push_back(word);
  }
  facts.iommu_present = fs::directory_iterator(root / "sys/class/iommu", error) != fs::directory_iterator();
  for (const auto& group : fs::directory_iterator(root / "sys/kernel/iommu_groups", error)) {
    const std::string type = trim(read_text(group.path() / "type"));
    if (!type.empty() && std::find(facts.iommu_domain_types.begin(), facts.iommu_domain_types.end(), type) ==
                             facts.iommu_domain_types.end()) {
      facts.iommu_domain_types.push_back(type);
    }
  }
  std::sort(facts.iommu_domain_types.begin(), facts.iommu_domain_types.end());
}

std::string read_binary(const fs::path& path) { return read_file(path, std::ios::in | std::ios::binary); }

// Every PCI bridge's ACS setting. sysfs gives non-root readers only the config space's first
// 64 bytes, so a short file says "unknown", not "no ACS".
void read_pci_bridges(const fs::path& root, HostFacts& facts) {
  std::error_code error;
  constexpr size_t kExtendedConfigBytes = 4096;
  for (const auto& device : fs::directory_iterator(root / "sys/bus/pci/devices", error)) {
    if (trim(read_text(device.path() / "class")).rfind("0x0604", 0) != 0) continue;
    ++facts.pci_bridges;
    const std::string config = read_binary(device.path() / "config");
    if (config.size() < kExtendedConfigBytes) {
      ++facts.pci_bridges_unreadable;
      continue;
    }
    const std::optional<uint16_t> control = acs_control(config);
    if (control && (*control & kAcsPeerToPeerBits)) {
      facts.acs_redirecting_bridges.push_back({device.path().filename().string(), *control});
    }
  }
  std::sort(facts.acs_redirecting_bridges.begin(), facts.acs_redirecting_bridges.end(),
            [](const AcsBridge& a, const AcsBridge& b) { return a.bdf < b.bdf; });
}

uint32_t little_endian(const std::string& bytes, size_t offset, size_t width) {
  uint32_t value = 0;
  for (size_t i = 0; i < width; ++i) value |= uint32_t{static_cast<unsigned char>(bytes[offset + i])} << (8 * i);
  return value;
}

}  // namespace

std::optional<uint16_t> acs_control(const std::string& config) {
  constexpr size_t kFirstExtendedCapability = 0x100;
  constexpr uint32_t kAcsCapabilityId = 0x000D;
  size_t offset = kFirstExtendedCapability;
  // Each header is 32 bits: capability id (bits 0-15), version (16-19), next offset (20-31,
  // 0 at the end). A list can hold at most 960 dword headers; more means a loop.
  for (int hops = 0; hops < 960 && offset + 4 <= config.size(); ++hops) {
    const uint32_t header = little_endian(config, offset, 4);
    if (header == 0 || header == 0xffffffff) return std::nullopt;
    if ((header & 0xffff) == kAcsCapabilityId) {
      if (offset + 8 > config.size()) return std::nullopt;
      return static_cast<uint16_t>(little_endian(config, offset + 6, 2));
    }
    const size_t next = (header >> 20) & 0xffc;
    if (next < kFirstExtendedCapability) return std::nullopt;
    offset = next;
  }
  return std::nullopt;
}

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

  read_kernel_log(under("/dev/kmsg"), facts);
  read_iommu(root, facts);
  read_pci_bridges(root, facts);
  return facts;
}

}  // namespace lockstep::tools
