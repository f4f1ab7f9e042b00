#include "lockstep/io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace lockstep {
namespace {

[[noreturn]] void fail_errno(const std::string& what, const std::string& path) {
  const int err = errno;
  LOCKSTEP_FAIL() << "checkpoint: cannot " << what << " '" << path << "': " << std::strerror(err);
  std::abort();  // unreachable: the line above throws
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) fail_errno("open", path);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    fail_errno("fsync", path);
  }
  ::close(fd);
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::function<void(const std::string& temp_path)>& write) {
  LOCKSTEP_CHECK(!path.empty() && path.back() != '/') << "checkpoint: '" << path << "' does not name a file";
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  try {
    write(temp);
    // Data must be on disk before the rename makes it the checkpoint, or a crash could
    // leave a renamed but empty file.
    fsync_path(temp, O_RDONLY);
    if (::rename(temp.c_str(), path.c_str()) != 0) fail_errno("rename '" + temp + "' over", path);
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  // The rename itself is durable only once the directory entry is.
  fsync_path(parent_directory(path), O_RDONLY | O_DIRECTORY);
}

void save_checkpoint(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  write_file_atomically(path, [&](const std::string& temp) { save_safetensors(temp, tensors, metadata); });
}

Checkpoint load_checkpoint(const std::string& path) { return load_safetensors(path); }

}  // namespace lockstep
