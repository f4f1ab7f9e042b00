// A point in one logical device's stream that other devices' streams can be ordered after,
// with no host wait: what work spread over several devices' streams needs wherever one
// device reads memory another device's stream writes, or frees memory another may still be
// reading (the caching allocator orders reuse by its own device's stream only).
#pragma once

#include "lockstep/core/cuda/runtime.h"

namespace lockstep::cuda {

// A CUDA event (timing off) on a logical device's GPU. record() marks what the device's
// stream has queued so far; wait_in(other) makes other's stream run what it queues later
// only once that mark is reached. Recording again moves the mark: a wait queued before the
// new record still waits for the old one, so the host must order each wait between the two
// records it means to fall between (a barrier of the host threads does).
class StreamEvent {
 public:
  explicit StreamEvent(Device device);
  ~StreamEvent();
  StreamEvent(StreamEvent&& other) noexcept;
  StreamEvent& operator=(StreamEvent&& other) noexcept;
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;

  Device device() const { return device_; }
  void record();
  void wait_in(Device waiting) const;

 private:
  Device device_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace lockstep::cuda
