// The bytes behind one or more tensors, on one device. Views share a Storage through a
// shared_ptr; the bytes return to the device allocator when the last view goes away.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "lockstep/core/allocator.h"
#include "lockstep/core/device.h"

namespace lockstep {

class Storage {
 public:
  Storage(Device device, size_t nbytes) : device_(device), nbytes_(nbytes), data_(device_alloc(device, nbytes)) {}
  // Memory that belongs to someone else (a shared-memory segment, a cudaMalloc block):
  // release(data) runs when the last view goes away; the device allocator never sees it.
  Storage(Device device, size_t nbytes, void* data, std::function<void(void*)> release)
      : device_(device), nbytes_(nbytes), data_(data), release_(std::move(release)) {}
  ~Storage() {
    if (release_) {
      release_(data_);
    } else {
      device_free(device_, data_, nbytes_);
    }
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Device device() const { return device_; }
  size_t nbytes() const { return nbytes_; }
  void* data() const { return data_; }

 private:
  Device device_;
  size_t nbytes_;
  void* data_;
  std::function<void(void*)> release_;
};

}  // namespace lockstep
