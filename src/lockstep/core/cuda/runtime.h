// The CUDA runtime as the backend's host code uses it: one stream per logical device
// (every op on that device is queued there, in program order), and a scope that makes a
// device's GPU current. Includes cuda_runtime.h; C++20 (the .cu files include check.h).
#pragma once

#include <functional>

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

// The nccl backend's calls in flight on a GPU (a CUDA device ordinal), so that the caching
// allocator can empty its cache without hanging. cudaFree waits for everything queued on the
// GPU, the other streams' NCCL kernels included, and such a kernel may wait for a peer rank
// that is itself waiting for this process to go on (a collective this thread has yet to call,
// a send its receive must match). The backend opens a CommunicationScope around each call,
// from its first NCCL operation to its host wait, which ends (done, failed or timed out and
// aborted) within the communicator's timeout.
class CommunicationScope {
 public:
  // Waits while a without_communication on gpu is running.
  explicit CommunicationScope(int gpu);
  ~CommunicationScope();
  CommunicationScope(const CommunicationScope&) = delete;
  CommunicationScope& operator=(const CommunicationScope&) = delete;

 private:
  int gpu_;
};

// Runs body (a cudaFree, which synchronizes the GPU) once no CommunicationScope is open on
// gpu, and holds new ones back until it returns: the communication work queued on the GPU
// drains first. what names the caller for the error thrown, instead of waiting forever, when
// the calling thread has a scope on gpu open itself.
void without_communication(int gpu, const char* what, const std::function<void()>& body);

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
