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
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/core/file_descriptor.h"

namespace lockstep::comm {

namespace {

using Clock = std::chrono::steady_clock;

// File names: keys are "k-<key>", temporaries "tmp-<pid>-<n>", the stores' processes
// "pid-<pid>", and add() and sign_in() lock "lock".
constexpr const char* kKeyPrefix = "k-";
constexpr const char* kTempPrefix = "tmp-";
constexpr const char* kMemberPrefix = "pid-";
constexpr const char* kLockName = "lock";

bool starts_with(const char* name, const char* prefix) { return std::strncmp(name, prefix, std::strlen(prefix)) == 0; }

bool store_file(const char* name) {
  return starts_with(name, kKeyPrefix) || starts_with(name, kTempPrefix) || starts_with(name, kMemberPrefix);
}

// When the process started (clock ticks after boot, /proc/<pid>/stat's 22nd field), or
// empty when there is no such process: with the pid it names one process, not a later one
// that got the same pid.
std::string start_time_of(pid_t pid) {
  FileDescriptor file(::open(("/proc/" + std::to_string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC));
  if (file.get() < 0) return "";
  char buffer[1024];
  const ssize_t n = ::read(file.get(), buffer, sizeof(buffer) - 1);
  if (n <= 0) return "";
  const std::string stat(buffer, static_cast<size_t>(n));
  // After the command, which is in parentheses and may hold anything, field 3 follows.
  size_t at = stat.rfind(')');
  for (int field = 2; field < 22 && at != std::string::npos; ++field) at = stat.find(' ', at + 1);
  if (at == std::string::npos) return "";
  return stat.substr(at + 1, stat.find(' ', at + 1) - at - 1);
}

// An flock held for the object's life.
class DirectoryLock {
 public:
  explicit DirectoryLock(const std::string& path) : file_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    LOCKSTEP_CHECK(file_.get() >= 0) << "cannot open the store's lock file " << path << ": " << strerror(errno);
    int locked = 0;
    while ((locked = ::flock(file_.get(), LOCK_EX)) != 0 && errno == EINTR) {
    }
    LOCKSTEP_CHECK(locked == 0) << "cannot lock " << path << ": " << strerror(errno);
  }

 private:
  FileDescriptor file_;  // closing it releases the lock
};

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
  sign_in();
}

void FileStore::sign_in() {
  const DirectoryLock lock(directory_ + "/" + kLockName);
  std::vector<std::string> files;
  bool someone_alive = false;
  if (DIR* listing = ::opendir(directory_.c_str())) {
    while (const dirent* entry = ::readdir(listing)) {
      const char* name = entry->d_name;
      if (!store_file(name)) continue;
      files.emplace_back(name);
      if (starts_with(name, kMemberPrefix)) {
        const pid_t pid = static_cast<pid_t>(std::atoll(name + std::strlen(kMemberPrefix)));
        const std::optional<std::string> started = read_file(directory_ + "/" + name);
        someone_alive = someone_alive || (pid > 0 && started && !started->empty() && *started == start_time_of(pid));
      }
    }
    ::closedir(listing);
  }
  // Every process that wrote here is gone: what it left belongs to a job that is over.
  if (!someone_alive) {
    for (const std::string& name : files) ::unlink((directory_ + "/" + name).c_str());
  }
  write_atomically(directory_ + "/" + kMemberPrefix + std::to_string(::getpid()), start_time_of(::getpid()));
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
  const DirectoryLock lock(directory_ + "/" + kLockName);
  int64_t total = delta;
  if (std::optional<std::string> value = read_file(path)) total += detail::parse_counter(key, *value);
  write_atomically(path, std::to_string(total));
  return total;
}

bool FileStore::check(const std::string& key) { return ::access(path_of(key).c_str(), F_OK) == 0; }

void FileStore::remove_directory() noexcept {
  if (DIR* listing = ::opendir(directory_.c_str())) {
    while (const dirent* entry = ::readdir(listing)) {
      const char* name = entry->d_name;
      if (store_file(name) || std::strcmp(name, kLockName) == 0) {
        ::unlink((directory_ + "/" + name).c_str());
      }
    }
    ::closedir(listing);
  }
  ::rmdir(directory_.c_str());
}

}  // namespace lockstep::comm
