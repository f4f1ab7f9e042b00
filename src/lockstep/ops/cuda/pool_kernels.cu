#include <cuda_runtime.h>

#include <algorithm>

#include "lockstep/core/cuda/check.h"
#include "lockstep/ops/cuda/pool_kernels.h"
#include "lockstep/ops/cuda/window2d_device.cuh"

namespace lockstep::ops::cuda {
namespace {

using lockstep::cuda::grid_for;

constexpr int kThreads = 256;

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

// Element i of a stack of rows × cols planes: its plane, its position within the plane, and
// that position's row and column.
template <typename I>
struct PlaneIndex {
  I plane, position, row, col;
};
template <typename I>
__device__ PlaneIndex<I> split(I i, I rows, I cols) {
  const I area = rows * cols;
  const I plane = i / area, position = i % area;
  return {plane, position, position / cols, position % cols};
}

// An element's plane, its position within the plane, and the rows and columns of the other
// side (input or output) that it meets.
template <typename I>
struct Reach {
  I plane, position;
  Span<I> rows, cols;
};

// Output element i: the input rows and columns its window reads.
template <typename I>
__device__ Reach<I> input_window(I i, const Geometry<I>& g) {
  const PlaneIndex<I> o = split(i, g.out_h, g.out_w);
  return {o.plane, o.position, under(o.row, g.stride_h, g.pad_h, g.kernel_h, g.in_h),
          under(o.col, g.stride_w, g.pad_w, g.kernel_w, g.in_w)};
}

// Input element i: the output rows and columns whose windows read it.
template <typename I>
__device__ Reach<I> output_windows(I i, const Geometry<I>& g) {
  const PlaneIndex<I> in = split(i, g.in_h, g.in_w);
  return {in.plane, in.position, covering(in.row, g.stride_h, g.pad_h, g.kernel_h, g.out_h),
          covering(in.col, g.stride_w, g.pad_w, g.kernel_w, g.out_w)};
}

// ops/cpu/pool.cpp's rule: a larger value, or a NaN, takes the window.
template <typename T>
__device__ bool beats(T candidate, T best) {
  return candidate > best || candidate != candidate;
}

template <typename T, typename I>
__global__ void max_forward_kernel(const T* x, Geometry<I> g, T* y, int32_t* argmax, I total) {
  const I in_plane = g.in_h * g.in_w;
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const Reach<I> in = input_window(i, g);
    const T* src = x + in.plane * in_plane;
    I index = in.rows.begin * g.in_w + in.cols.begin;
    T best = src[index];
    for (I h = in.rows.begin; h < in.rows.end; ++h) {
      for (I w = in.cols.begin; w < in.cols.end; ++w) {
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
  const I out_plane = g.out_h * g.out_w;
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const Reach<I> out = output_windows(i, g);
    const I base = out.plane * out_plane;
    T sum = T(0);
    for (I oh = out.rows.begin; oh < out.rows.end; ++oh) {
      for (I ow = out.cols.begin; ow < out.cols.end; ++ow) {
        const I o = base + oh * g.out_w + ow;
        if (argmax[o] == static_cast<int32_t>(out.position)) sum += dy[o];
      }
    }
    dx[i] = sum;
  }
}

template <typename T, typename I>
__global__ void avg_forward_kernel(const T* x, Geometry<I> g, T scale, T* y, I total) {
  const I in_plane = g.in_h * g.in_w;
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const Reach<I> in = input_window(i, g);
    const T* src = x + in.plane * in_plane;
    T sum = T(0);
    for (I h = in.rows.begin; h < in.rows.end; ++h)
      for (I w = in.cols.begin; w < in.cols.end; ++w) sum += src[h * g.in_w + w];
    y[i] = sum * scale;
  }
}

template <typename T, typename I>
__global__ void avg_backward_kernel(const T* dy, Geometry<I> g, T scale, T* dx, I total) {
  const I out_plane = g.out_h * g.out_w;
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const Reach<I> out = output_windows(i, g);
    const T* src = dy + out.plane * out_plane;
    T sum = T(0);
    for (I oh = out.rows.begin; oh < out.rows.end; ++oh)
      for (I ow = out.cols.begin; ow < out.cols.end; ++ow) sum += src[oh * g.out_w + ow] * scale;
    dx[i] = sum;
  }
}

}  // namespace

template <typename T>
void max_pool2d_forward(const T* x, int64_t planes, const cpu::Window2d& win, T* y, int32_t* argmax,
                        CUstream_st* stream) {
  const int64_t total = planes * win.out_plane();
  if (total == 0) return;
  launch_with_index_type(std::max(total, planes * win.in_plane()), [&](auto index) {
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
  launch_with_index_type(std::max(total, planes * win.out_plane()), [&](auto index) {
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
  launch_with_index_type(std::max(total, planes * win.in_plane()), [&](auto index) {
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
  launch_with_index_type(std::max(total, planes * win.out_plane()), [&](auto index) {
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
