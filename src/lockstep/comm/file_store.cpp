#include "lockstep/comm/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "lockstep/comm/communicator.h"
#include "lockstep/core/file_descriptor.h"

namespace lockstep::comm {

namespace {

using Clock = std::chrono::steady_clock;

// File names: keys are "k-<key>", temporaries "tmp-<pid>-<n>", and add() locks "lock".
constexpr const char* kKeyPrefix = "k-";
constexpr const char* kTempPrefix = "tmp-";
constexpr const char* kLockName = "lock";

bool starts_with(const char* name, const char* prefix) { return std::strncmp(name, prefix, std::strlen(prefix)) == 0; }

// The file's bytes, or nothing when it does not exist.
std::optional<std::string> read_file(const std::string& path) {
  FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.get() < 0) {
    LOCKSTEP_CHECK(errno == ENOENT) << "cannot read store file " << path << ": " << strerror(errno);
    return std::nullopt;
  }
  std::string bytes;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(file.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    LOCKSTEP_CHECK(n >= 0) << "cannot read store file " << path << ": " << strerror(errno);
    if (n == 0) return bytes;
    bytes.append(buffer, static_cast<size_t>(n));
  }
}

}  // namespace

FileStore::FileStore(std::string directory, bool remove_on_destroy)
    : directory_(std::move(directory)), remove_on_destroy_(remove_on_destroy) {
  LOCKSTEP_CHECK(!directory_.empty()) << "FileStore needs a directory";
  if (::mkdir(directory_.c_str(), 0700) != 0) {
    LOCKSTEP_CHECK(errno == EEXIST) << "cannot create the rendezvous directory " << directory_ << ": "
                                    << strerror(errno);
  }
  struct stat info {};
  LOCKSTEP_CHECK(::lstat(directory_.c_str(), &info) == 0)
      << "cannot inspect the rendezvous directory " << directory_ << ": " << strerror(errno);
  LOCKSTEP_CHECK(S_ISDIR(info.st_mode)) << "the rendezvous path " << directory_
                                        << " exists and is not a directory; remove it";
  LOCKSTEP_CHECK(info.st_uid == ::geteuid())
      << "the rendezvous directory " << directory_ << " belongs to user id " << info.st_uid << ", not to this user ("
      << ::geteuid() << "); remove it, or set MASTER_ADDR/MASTER_PORT to meet over TCP instead";
}

FileStore::~FileStore() {
  if (remove_on_destroy_) remove_directory();
}

std::string FileStore::path_of(const std::string& key) const {
  // Keys hold '/' and anything else; file names get letters, digits, '-' and '_', the rest
  // as %XX, which also keeps them apart from the temporary and lock files.
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string name = kKeyPrefix;
  for (const char c : key) {
    const auto byte = static_cast<unsigned char>(c);
    if (std::isalnum(byte) || c == '-' || c == '_') {
      name += c;
    } else {
      name += '%';
      name += kHex[byte >> 4];
      name += kHex[byte & 15];
    }
  }
  LOCKSTEP_CHECK(name.size() <= 250) << "store key '" << key
                                     << "' is too long for a FileStore file name; use keys under ~80 characters";
  return directory_ + "/" + name;
}

void FileStore::write_atomically(const std::string& path, const std::string& value) const {
  // Unique across the processes (pid) and threads (counter) of this host.
  static std::atomic<uint64_t> counter{0};
  const std::string temp = directory_ + "/" + kTempPrefix + std::to_string(::getpid()) + "-" +
                           std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
  {
    FileDescriptor file(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    LOCKSTEP_CHECK(file.get() >= 0) << "cannot write store file " << temp << ": " << strerror(errno)
                                    << " (was the rendezvous directory removed while ranks still use it?)";
    for (size_t written = 0; written < value.size();) {
      const ssize_t n = ::write(file.get(), value.data() + written, value.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int error = errno;
        ::unlink(temp.c_str());
        LOCKSTEP_FAIL() << "cannot write store file " << temp << ": " << strerror(error);
      }
      written += static_cast<size_t>(n);
    }
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    LOCKSTEP_FAIL() << "cannot rename store file " << temp << " to " << path << ": " << strerror(error);
  }
}

void FileStore::set(const std::string& key, const std::string& value) { write_atomically(path_of(key), value); }

std::string FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string path = path_of(key);
  const Clock::time_point deadline = Clock::now() + detail::clamp_timeout(timeout);
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (std::optional<std::string> value = read_file(path)) return *value;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      throw CommError(detail::key_timeout_message(key, timeout, " directory " + directory_));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(5));
  }
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  const std::string path = path_of(key);
  const std::string lock_path = directory_ + "/" + kLockName;
  FileDescriptor lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  LOCKSTEP_CHECK(lock.get() >= 0) << "cannot open the store's lock file " << lock_path << ": " << strerror(errno);
  int locked = 0;
  while ((locked = ::flock(lock.get(), LOCK_EX)) != 0 && errno == EINTR) {
  }
  LOCKSTEP_CHECK(locked == 0) << "cannot lock " << lock_path << ": " << strerror(errno);
  int64_t total = delta;
  if (std::optional<std::string> value = read_file(path)) total += detail::parse_counter(key, *value);
  write_atomically(path, std::to_string(total));
  return total;  // closing the lock file releases the lock
}

bool FileStore::check(const std::string& key) { return ::access(path_of(key).c_str(), F_OK) == 0; }

void FileStore::remove_directory() noexcept {
  if (DIR* listing = ::opendir(directory_.c_str())) {
    while (const dirent* entry = ::readdir(listing)) {
      const char* name = entry->d_name;
      if (starts_with(name, kKeyPrefix) || starts_with(name, kTempPrefix) || std::strcmp(name, kLockName) == 0) {
        ::unlink((directory_ + "/" + name).c_str());
      }
    }
    ::closedir(listing);
  }
  ::rmdir(directory_.c_str());
}

}  // namespace lockstep::comm
