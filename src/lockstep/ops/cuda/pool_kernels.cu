#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "lockstep/core/cuda/check.h"
#include "lockstep/ops/cuda/pool_kernels.h"

namespace lockstep::ops::cuda {
namespace {

using lockstep::cuda::grid_for;

constexpr int kThreads = 256;

// The window in the kernel's index type: 32-bit where every index fits (integer division is
// several times cheaper), else 64-bit.
template <typename I>
struct Geometry {
  I in_h, in_w, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, out_h, out_w;
};

template <typename I>
Geometry<I> geometry(const cpu::Window2d& w) {
  return {static_cast<I>(w.in_h),     static_cast<I>(w.in_w),     static_cast<I>(w.kernel_h),
          static_cast<I>(w.kernel_w), static_cast<I>(w.stride_h), static_cast<I>(w.stride_w),
          static_cast<I>(w.pad_h),    static_cast<I>(w.pad_w),    static_cast<I>(w.out_h),
          static_cast<I>(w.out_w)};
}

// Room for the last grid-stride step past the end (at most grid_for's 65535·8 blocks).
bool fits_int32(int64_t largest) { return largest <= INT_MAX / 2; }

template <typename I>
__device__ I first_index() {
  return static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
}
template <typename I>
__device__ I grid_stride() {
  return static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
}

// The input span [begin, end) under output position o on one axis: Window2d::clip.
template <typename I>
struct Span {
  I begin, end;
};
template <typename I>
__device__ Span<I> under(I o, I stride, I pad, I kernel, I size) {
  const I start = o * stride - pad;
  return {start < 0 ? I(0) : start, start + kernel < size ? start + kernel : size};
}

// The output positions [begin, end) whose window covers input position i on one axis:
// o·stride - pad <= i < o·stride - pad + kernel.
template <typename I>
__device__ Span<I> covering(I i, I stride, I pad, I kernel, I out) {
  const I padded = i + pad;  // >= 0
  const I low = padded - kernel + 1;
  const I begin = low <= 0 ? I(0) : (low + stride - 1) / stride;
  const I last = padded / stride;
  return {begin, last + 1 < out ? last + 1 : out};
}

// ops/cpu/pool.cpp's rule: a larger value, or a NaN, takes the window.
template <typename T>
__device__ bool beats(T candidate, T best) {
  return candidate > best || candidate != candidate;
}

template <typename T, typename I>
__global__ void max_forward_kernel(const T* x, Geometry<I> g, T* y, int32_t* argmax, I total) {
  const I out_plane = g.out_h * g.out_w, in_plane = g.in_h * g.in_w;
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const I plane = i / out_plane, q = i % out_plane;
    const I oh = q / g.out_w, ow = q % g.out_w;
    const Span<I> rows = under(oh, g.stride_h, g.pad_h, g.kernel_h, g.in_h);
    const Span<I> cols = under(ow, g.stride_w, g.pad_w, g.kernel_w, g.in_w);
    const T* src = x + plane * in_plane;
    I index = rows.begin * g.in_w + cols.begin;
    T best = src[index];
    for (I h = rows.begin; h < rows.end; ++h) {
      for (I w = cols.begin; w < cols.end; ++w) {
        const T v = src[h * g.in_w + w];
        if (beats(v, best)) best = v, index = h * g.in_w + w;
      }
    }
    y[i] = best;
    argmax[i] = static_cast<int32_t>(index);
  }
}

template <typename T, typename I>
__global__ void max_backward_kernel(const T* dy, const int32_t* argmax, Geometry<I> g, T* dx, I total) {
  const I out_plane = g.out_h * g.out_w, in_plane = g.in_h * g.in_w;
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const I plane = i / in_plane, r = i % in_plane;
    const I ih = r / g.in_w, iw = r % g.in_w;
    const Span<I> rows = covering(ih, g.stride_h, g.pad_h, g.kernel_h, g.out_h);
    const Span<I> cols = covering(iw, g.stride_w, g.pad_w, g.kernel_w, g.out_w);
    const I base = plane * out_plane;
    T sum = T(0);
    for (I oh = rows.begin; oh < rows.end; ++oh) {
      for (I ow = cols.begin; ow < cols.end; ++ow) {
        const I o = base + oh * g.out_w + ow;
        if (argmax[o] == static_cast<int32_t>(r)) sum += dy[o];
      }
    }
    dx[i] = sum;
  }
}

template <typename T, typename I>
__global__ void avg_forward_kernel(const T* x, Geometry<I> g, T scale, T* y, I total) {
  const I out_plane = g.out_h * g.out_w, in_plane = g.in_h * g.in_w;
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const I plane = i / out_plane, q = i % out_plane;
    const I oh = q / g.out_w, ow = q % g.out_w;
    const Span<I> rows = under(oh, g.stride_h, g.pad_h, g.kernel_h, g.in_h);
    const Span<I> cols = under(ow, g.stride_w, g.pad_w, g.kernel_w, g.in_w);
    const T* src = x + plane * in_plane;
    T sum = T(0);
    for (I h = rows.begin; h < rows.end; ++h)
      for (I w = cols.begin; w < cols.end; ++w) sum += src[h * g.in_w + w];
    y[i] = sum * scale;
  }
}

template <typename T, typename I>
__global__ void avg_backward_kernel(const T* dy, Geometry<I> g, T scale, T* dx, I total) {
  const I out_plane = g.out_h * g.out_w, in_plane = g.in_h * g.in_w;
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const I plane = i / in_plane, r = i % in_plane;
    const I ih = r / g.in_w, iw = r % g.in_w;
    const Span<I> rows = covering(ih, g.stride_h, g.pad_h, g.kernel_h, g.out_h);
    const Span<I> cols = covering(iw, g.stride_w, g.pad_w, g.kernel_w, g.out_w);
    const T* src = dy + plane * out_plane;
    T sum = T(0);
    for (I oh = rows.begin; oh < rows.end; ++oh)
      for (I ow = cols.begin; ow < cols.end; ++ow) sum += src[oh * g.out_w + ow] * scale;
    dx[i] = sum;
  }
}

// Calls body(I{}) with the narrowest index type I that holds every index (largest, the
// larger of the input and output element counts), then checks the launch.
template <typename Launch>
void launch(int64_t largest, const Launch& body) {
  if (fits_int32(largest)) {
    body(int32_t{});
  } else {
    body(int64_t{});
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <typename T>
void max_pool2d_forward(const T* x, int64_t planes, const cpu::Window2d& win, T* y, int32_t* argmax,
                        CUstream_st* stream) {
  const int64_t total = planes * win.out_plane();
  if (total == 0) return;
  launch(std::max(total, planes * win.in_plane()), [&](auto index) {
    using I = decltype(index);
    max_forward_kernel<T, I>
        <<<grid_for(total, kThreads), kThreads, 0, stream>>>(x, geometry<I>(win), y, argmax, static_cast<I>(total));
  });
}

template <typename T>
void max_pool2d_backward(const T* dy, const int32_t* argmax, int64_t planes, const cpu::Window2d& win, T* dx,
                         CUstream_st* stream) {
  const int64_t total = planes * win.in_plane();
  if (total == 0) return;
  launch(std::max(total, planes * win.out_plane()), [&](auto index) {
    using I = decltype(index);
    max_backward_kernel<T, I>
        <<<grid_for(total, kThreads), kThreads, 0, stream>>>(dy, argmax, geometry<I>(win), dx, static_cast<I>(total));
  });
}

template <typename T>
void avg_pool2d_forward(const T* x, int64_t planes, const cpu::Window2d& win, T* y, CUstream_st* stream) {
  const int64_t total = planes * win.out_plane();
  if (total == 0) return;
  const T scale = T(1) / static_cast<T>(win.kernel_area());
  launch(std::max(total, planes * win.in_plane()), [&](auto index) {
    using I = decltype(index);
    avg_forward_kernel<T, I>
        <<<grid_for(total, kThreads), kThreads, 0, stream>>>(x, geometry<I>(win), scale, y, static_cast<I>(total));
  });
}

template <typename T>
void avg_pool2d_backward(const T* dy, int64_t planes, const cpu::Window2d& win, T* dx, CUstream_st* stream) {
  const int64_t total = planes * win.in_plane();
  if (total == 0) return;
  const T scale = T(1) / static_cast<T>(win.kernel_area());
  launch(std::max(total, planes * win.out_plane()), [&](auto index) {
    using I = decltype(index);
    avg_backward_kernel<T, I>
        <<<grid_for(total, kThreads), kThreads, 0, stream>>>(dy, geometry<I>(win), scale, dx, static_cast<I>(total));
  });
}

template void max_pool2d_forward<float>(const float*, int64_t, const cpu::Window2d&, float*, int32_t*, CUstream_st*);
template void max_pool2d_forward<double>(const double*, int64_t, const cpu::Window2d&, double*, int32_t*, CUstream_st*);
template void max_pool2d_backward<float>(const float*, const int32_t*, int64_t, const cpu::Window2d&, float*,
                                         CUstream_st*);
template void max_pool2d_backward<double>(const double*, const int32_t*, int64_t, const cpu::Window2d&, double*,
                                          CUstream_st*);
template void avg_pool2d_forward<float>(const float*, int64_t, const cpu::Window2d&, float*, CUstream_st*);
template void avg_pool2d_forward<double>(const double*, int64_t, const cpu::Window2d&, double*, CUstream_st*);
template void avg_pool2d_backward<float>(const float*, int64_t, const cpu::Window2d&, float*, CUstream_st*);
template void avg_pool2d_backward<double>(const double*, int64_t, const cpu::Window2d&, double*, CUstream_st*);

}  // namespace lockstep::ops::cuda
