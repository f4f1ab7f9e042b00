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
    if (released_) return;
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
  void* data() const {
    if (released_) fail_released();
    return data_;
  }

  // Frees the bytes while views of them live on (PyTorch's storage resize to zero): ZeRO-3
  // releases a unit's gathered parameters between their uses while autograd still holds
  // views of them. Any access before allocate_bytes() fails, naming the cause. Storage of
  // the device allocator only.
  void release_bytes() {
    if (released_) return;
    if (release_) fail_not_own();
    device_free(device_, data_, nbytes_);
    data_ = nullptr;
    released_ = true;
  }
  // New bytes (contents undefined) for released storage; nothing if it holds its bytes.
  void allocate_bytes() {
    if (!released_) return;
    data_ = device_alloc(device_, nbytes_);
    released_ = false;
  }
  bool released() const { return released_; }

 private:
  Device device_;
  size_t nbytes_;
  void* data_;
  std::function<void(void*)> release_;
  bool released_ = false;

  [[noreturn]] static void fail_released();
  [[noreturn]] static void fail_not_own();
};

}  // namespace lockstep
