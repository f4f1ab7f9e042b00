#include "lockstep/core/cuda/tensor_copy.h"

#include <cmath>

#include "lockstep/core/cuda/copy_kernels.h"
#include "lockstep/core/cuda/peer_access.h"
#include "lockstep/core/cuda/pinned_staging.h"
#include "lockstep/core/cuda/runtime.h"

namespace lockstep::cuda {
namespace {

StridedView view_of(const Tensor& t) {
  StridedView view;
  view.base = t.storage()->data();
  view.dtype = t.dtype();
  view.offset = t.offset();
  LOCKSTEP_CHECK(t.dim() <= kMaxCopyDims)
      << "a copy on a GPU handles at most " << kMaxCopyDims << " dimensions; this tensor has " << t.dim();
  for (int64_t k = 0; k < t.dim(); ++k) view.strides[k] = t.strides()[static_cast<size_t>(k)];
  return view;
}

// A copy between two tensors on the same GPU device, queued on its stream.
void copy_on_device(const Tensor& src, const Tensor& dst) {
  const cudaStream_t s = stream(dst.device());
  DeviceScope scope(dst.device());
  if (src.is_contiguous() && dst.is_contiguous() && src.dtype() == dst.dtype()) {
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToDevice, s));
    return;
  }
  copy_elements(view_of(src), view_of(dst), dst.shape().data(), static_cast<int>(dst.dim()), dst.numel(), s);
}

// t itself when it is contiguous with the given dtype, else a contiguous copy on its device.
Tensor dense(const Tensor& t, DType dtype) {
  if (t.is_contiguous() && t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  out.copy_from(t);
  return out;
}

// src and dst contiguous, same dtype, on two GPU devices: the destination's stream waits
// for the source's producers, copies, and the source's stream waits for the copy, so the
// source's memory is not reused (its device's allocator hands it out again in that
// stream's order) before the copy has read it.
void copy_between_devices(const Tensor& src, const Tensor& dst) {
  const cudaStream_t from = stream(src.device()), to = stream(dst.device());
  const int src_gpu = physical_device(src.device()), dst_gpu = physical_device(dst.device());
  {
    const DeviceScope producer(src.device());  // an event is recorded only on a stream of its own GPU
    stream_wait(to, from);
  }
  DeviceScope scope(dst.device());
  if (src_gpu == dst_gpu) {
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToDevice, to));
  } else {
    can_read_peer_memory(dst_gpu, src_gpu);  // a direct copy where the GPUs can reach each other
    LOCKSTEP_CUDA_CHECK(cudaMemcpyPeerAsync(dst.data_ptr(), dst_gpu, src.data_ptr(), src_gpu, src.nbytes(), to));
  }
  stream_wait(from, to);
}

}  // namespace

void copy_tensor(const Tensor& src, const Tensor& dst) {
  if (src.numel() == 0) return;
  const Device from = src.device(), to = dst.device();
  if (from == to) return copy_on_device(src, dst);
  if (from.is_cpu()) {
    // Host to device: the bytes cross in the source's dtype, contiguous; the GPU converts.
    const Tensor host = dense(src, src.dtype());
    const Tensor staged =
        dst.is_contiguous() && dst.dtype() == src.dtype() ? dst : Tensor::empty(src.shape(), src.dtype(), to);
    const cudaStream_t s = stream(to);
    DeviceScope scope(to);
    if (host.nbytes() <= kMaxStagedCopyBytes) {
      // Through a pinned block: queued behind the stream's work, with no wait for it.
      copy_to_device_staged(staged.data_ptr(), host.data_ptr(), host.nbytes(), s);
      if (!staged.is_same(dst)) copy_on_device(staged, dst);
      return;
    }
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(staged.data_ptr(), host.data_ptr(), host.nbytes(), cudaMemcpyHostToDevice, s));
    if (!staged.is_same(dst)) copy_on_device(staged, dst);
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));  // the host buffer may be freed on return
    return;
  }
  if (to.is_cpu()) {
    // Device to host: the GPU converts into the destination's dtype, contiguous.
    const Tensor device_side = dense(src, dst.dtype());
    const Tensor host = dense(dst, dst.dtype());
    const cudaStream_t s = stream(from);
    DeviceScope scope(from);
    LOCKSTEP_CUDA_CHECK(
        cudaMemcpyAsync(host.data_ptr(), device_side.data_ptr(), host.nbytes(), cudaMemcpyDeviceToHost, s));
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
    if (!host.is_same(dst)) dst.copy_from(host);
    return;
  }
  // Between GPU devices: contiguous in the source's dtype across, converted on arrival.
  const Tensor sent = dense(src, src.dtype());
  const Tensor received =
      dst.is_contiguous() && dst.dtype() == src.dtype() ? dst : Tensor::empty(src.shape(), src.dtype(), to);
  copy_between_devices(sent, received);
  if (!received.is_same(dst)) copy_on_device(received, dst);
}

void fill_tensor(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  const cudaStream_t s = stream(dst.device());
  DeviceScope scope(dst.device());
  if (value == 0.0 && !std::signbit(value) && dst.is_contiguous()) {  // -0.0 is not all-zero bits
    LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), s));
    return;
  }
  fill_elements(view_of(dst), value, dst.shape().data(), static_cast<int>(dst.dim()), dst.numel(), s);
}

}  // namespace lockstep::cuda
