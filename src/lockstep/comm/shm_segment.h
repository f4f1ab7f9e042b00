// A POSIX shared-memory segment (/dev/shm): created by one process, mapped by others, and
// unlinked as soon as all have mapped it, so nothing outlives the processes (a crash or
// kill -9 included). Space is reserved up front: a full /dev/shm is a clear error at
// creation rather than a SIGBUS mid-collective.
#pragma once

#include <cstddef>
#include <string>

namespace lockstep::comm {

class ShmSegment {
 public:
  ShmSegment() = default;
  // Creates `name` ("/lockstep-..."), sized and zeroed; fails if it exists.
  static ShmSegment create(const std::string& name, size_t bytes);
  // Maps an existing segment; bytes must match its creator's.
  static ShmSegment open(const std::string& name, size_t bytes);
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  ShmSegment(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Removes the name (the memory stays until the last mapping goes); a missing name is fine.
void unlink_segment(const std::string& name);

}  // namespace lockstep::comm
