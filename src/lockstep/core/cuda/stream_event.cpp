#include "lockstep/core/cuda/stream_event.h"

#include <utility>

namespace lockstep::cuda {

StreamEvent::StreamEvent(Device device) : device_(device) {
  const DeviceScope scope(device);  // an event belongs to the GPU current at its creation
  LOCKSTEP_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

StreamEvent::~StreamEvent() {
  // Safe while a wait on it is still queued: CUDA releases the event once that has run.
  if (event_ != nullptr) cudaEventDestroy(event_);
}

StreamEvent::StreamEvent(StreamEvent&& other) noexcept
    : device_(other.device_), event_(std::exchange(other.event_, nullptr)) {}

StreamEvent& StreamEvent::operator=(StreamEvent&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void StreamEvent::record() {
  const OnDevice on(device_);  // CUDA records an event only on a stream of its own GPU
  LOCKSTEP_CUDA_CHECK(cudaEventRecord(event_, on.stream()));
}

void StreamEvent::wait_in(Device waiting) const {
  if (waiting == device_) return;  // one stream runs in order
  const OnDevice on(waiting);
  LOCKSTEP_CUDA_CHECK(cudaStreamWaitEvent(on.stream(), event_, 0));
}

}  // namespace lockstep::cuda
