#include "lockstep/gpu/gpu_leases.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "lockstep/core/error.h"

namespace lockstep::gpu {
namespace {

// A UUID as a file name: letters, digits and '-' as they are, anything else '_'.
std::string file_name(const std::string& uuid) {
  std::string name = "gpu-";
  for (const char c : uuid) name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  return name + ".lease";
}

// Opens (making it, writable by every user) the lease file; -1 with errno on failure.
int open_lease(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd >= 0) ::fchmod(fd, 0666);  // past the umask: another user's launcher must open it too
  return fd;
}

}  // namespace

std::string lease_directory() {
  if (const char* dir = std::getenv("LOCKSTEP_GPU_LEASE_DIR"); dir != nullptr && *dir != '\0') return dir;
  return "/tmp/lockstep-gpu-leases";
}

GpuLeases::GpuLeases(std::string directory) : directory_(std::move(directory)) {
  if (::mkdir(directory_.c_str(), 01777) == 0) ::chmod(directory_.c_str(), 01777);
  struct stat info {};
  LOCKSTEP_CHECK(::stat(directory_.c_str(), &info) == 0 && S_ISDIR(info.st_mode))
      << "cannot use the GPU lease directory " << directory_ << ": " << std::strerror(errno);
}

GpuLeases::~GpuLeases() { release_all(); }

std::string GpuLeases::path_of(const std::string& uuid) const { return directory_ + "/" + file_name(uuid); }

bool GpuLeases::take_all(const std::vector<std::string>& uuids, const std::string& holder) {
  std::vector<int> taken;
  for (const std::string& uuid : uuids) {
    const std::string path = path_of(uuid);
    const int fd = open_lease(path);
    LOCKSTEP_CHECK(fd >= 0) << "cannot open the GPU lease " << path << ": " << std::strerror(errno);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      for (const int t : taken) ::close(t);  // all or none
      return false;
    }
    taken.push_back(fd);
    // Who holds it, for the others to show; the lock, not the text, is the lease.
    if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, holder.data(), holder.size(), 0);
  }
  fds_.insert(fds_.end(), taken.begin(), taken.end());
  return true;
}

void GpuLeases::release_all() {
  for (const int fd : fds_) ::close(fd);  // closing the last descriptor releases the flock
  fds_.clear();
}

std::map<unsigned, std::string> GpuLeases::held_elsewhere(const GpuState& state) const {
  std::map<unsigned, std::string> held;
  for (const GpuDevice& device : state.devices) {
    const int fd = ::open(path_of(device.uuid).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;  // never leased
    // A shared lock is refused while anyone holds the exclusive one: another process, or
    // this one (its own leases are not "elsewhere": it knows them).
    if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
      char text[512];
      const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
      held[device.index] = n > 0 ? std::string(text, static_cast<size_t>(n)) : std::string("another job");
    }
    ::close(fd);
  }
  return held;
}

std::map<unsigned, std::string> leased_gpus(const GpuState& state) {
  if (state.devices.empty()) return {};
  try {
    return GpuLeases().held_elsewhere(state);
  } catch (const Error&) {
    return {};
  }
}

}  // namespace lockstep::gpu
