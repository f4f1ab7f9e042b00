#include "lockstep/io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "lockstep/io/sha256.h"

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

std::string tensors_sha256(const NamedTensors& tensors) {
  Sha256 hash;
  for (const auto& [name, tensor] : tensors) {
    // Each field ends with a NUL, so no two lists of names and shapes hash alike.
    hash.update(name.c_str(), name.size() + 1);
    const std::string dtype = dtype_name(tensor.dtype());
    hash.update(dtype.c_str(), dtype.size() + 1);
    for (int64_t size : tensor.shape()) hash.update(&size, sizeof(size));
    hash.update("", 1);
    hash.update(tensor);
  }
  return hash.hex_digest();
}

void save_checkpoint(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  LOCKSTEP_CHECK(!metadata.contains(kTensorsSha256Key))
      << "checkpoint: the metadata key '" << kTensorsSha256Key << "' is the checkpoint's own";
  Metadata with_hash = metadata;
  with_hash[kTensorsSha256Key] = tensors_sha256(tensors);
  write_file_atomically(path, [&](const std::string& temp) { save_safetensors(temp, tensors, with_hash); });
}

Checkpoint load_checkpoint(const std::string& path) {
  Checkpoint checkpoint = load_safetensors(path);
  const auto recorded = checkpoint.metadata.find(kTensorsSha256Key);
  if (recorded == checkpoint.metadata.end()) return checkpoint;
  const std::string actual = tensors_sha256(checkpoint.tensors);
  LOCKSTEP_CHECK(actual == recorded->second)
      << "checkpoint '" << path << "' is corrupt: its tensors hash to " << actual.substr(0, 12) << "..., it records "
      << recorded->second.substr(0, 12) << "...";
  checkpoint.metadata.erase(recorded);
  return checkpoint;
}

}  // namespace lockstep
