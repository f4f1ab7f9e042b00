// The CUDA runtime as the backend's host code uses it: one stream per logical device
// (every op on that device is queued there, in program order), and a scope that makes a
// device's GPU current. Includes cuda_runtime.h; C++20 (the .cu files include check.h).
#pragma once

#include "lockstep/core/cuda/check.h"
#include "lockstep/core/cuda_device.h"

namespace lockstep::cuda {

// The stream every op on this logical device runs on, created on first use (non-blocking:
// it never waits on the legacy default stream). Lives as long as the process.
cudaStream_t stream(Device device);

// Makes the device's GPU the calling thread's current one for a scope (kernel launches and
// cuBLAS calls go to the current GPU), and puts the previous one back if this process has
// used it (see gpu_used).
class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// Orders `waiting`'s later work after what `producer` has queued so far (no host wait).
// The producer's GPU must be current: CUDA records an event only on a stream of the GPU it
// was created on.
void stream_wait(cudaStream_t waiting, cudaStream_t producer);

// The GPUs this process has made current (DeviceScope, the nccl backend's own scope). A
// scope puts back only such a GPU when it ends: making another one current creates a CUDA
// context there (hundreds of MiB), so a ddp rank that drives only cuda:3 would hold memory
// on GPU 0 too, and fail where each GPU is exclusive to one process.
void mark_gpu_used(int gpu);
bool gpu_used(int gpu);

// What launching on a device takes: its GPU current for the scope, and its stream.
class OnDevice {
 public:
  explicit OnDevice(Device device) : scope_(device), stream_(cuda::stream(device)) {}
  cudaStream_t stream() const { return stream_; }

 private:
  DeviceScope scope_;
  cudaStream_t stream_;
};

}  // namespace lockstep::cuda
