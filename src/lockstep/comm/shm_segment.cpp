#include "lockstep/comm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "lockstep/core/error.h"

namespace lockstep::comm {
namespace {

std::string mib(double bytes) { return std::to_string(static_cast<int64_t>(bytes / (1 << 20))) + " MiB"; }

void* map(int fd, const std::string& name, size_t bytes) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  LOCKSTEP_CHECK(data != MAP_FAILED) << "cannot map shared memory " << name << " (" << bytes
                                     << " bytes): " << std::strerror(error);
  return data;
}

}  // namespace

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  LOCKSTEP_CHECK(fd >= 0) << "cannot create shared memory " << name << ": " << std::strerror(errno);
  // Reserve the pages now; tmpfs would otherwise hand out a SIGBUS when it fills up.
  const int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (error != 0) {
    close(fd);
    shm_unlink(name.c_str());
    struct statvfs fs {};
    const bool known = statvfs("/dev/shm", &fs) == 0;
    LOCKSTEP_FAIL() << "cannot reserve " << mib(static_cast<double>(bytes)) << " in /dev/shm for " << name << ": "
                    << std::strerror(error)
                    << (known ? " (" + mib(static_cast<double>(fs.f_bavail) * fs.f_frsize) + " free of " +
                                    mib(static_cast<double>(fs.f_blocks) * fs.f_frsize) + ")"
                              : std::string())
                    << "; containers default to 64 MiB: start with a larger one (docker run --shm-size=2g), or "
                       "lower LOCKSTEP_SHM_STAGING_BYTES";
  }
  return ShmSegment(map(fd, name, bytes), bytes);
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  LOCKSTEP_CHECK(fd >= 0) << "cannot open shared memory " << name << " of another rank: " << std::strerror(errno)
                          << "; all ranks of an shm group must run on one host, as one user";
  struct stat info {};
  const bool stated = fstat(fd, &info) == 0;
  if (!stated || info.st_uid != geteuid() || static_cast<size_t>(info.st_size) != bytes) close(fd);
  LOCKSTEP_CHECK(stated) << "cannot inspect shared memory " << name << ": " << std::strerror(errno);
  // A segment of another user is not the job's, whoever named it.
  LOCKSTEP_CHECK(info.st_uid == geteuid()) << "shared memory " << name << " belongs to user " << info.st_uid
                                           << ", not to this job's user " << geteuid() << ": refusing to map it";
  LOCKSTEP_CHECK(static_cast<size_t>(info.st_size) == bytes)
      << "shared memory " << name << " has " << info.st_size << " bytes, expected " << bytes;
  return ShmSegment(map(fd, name, bytes), bytes);
}

ShmSegment::~ShmSegment() {
  if (data_) munmap(data_, bytes_);
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    if (data_) munmap(data_, bytes_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void unlink_segment(const std::string& name) { shm_unlink(name.c_str()); }

}  // namespace lockstep::comm
