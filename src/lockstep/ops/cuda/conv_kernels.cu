#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "lockstep/core/cuda/check.h"
#include "lockstep/core/error.h"
#include "lockstep/ops/cuda/conv_kernels.h"
#include "lockstep/ops/cuda/shared_tree_sum.cuh"
#include "lockstep/ops/cuda/window2d_device.cuh"

namespace lockstep::ops::cuda {
namespace {

using lockstep::cuda::grid_for;

constexpr int kThreads = 256;

// One thread per (channel, column): the KH·KW rows of that column, written with consecutive
// threads on consecutive columns.
template <typename T, typename I>
__global__ void im2col_kernel(const T* x, I channels, Geometry<I> g, T* col, I ld, I columns, I total) {
  const I plane = g.out_h * g.out_w;
  const I kernel_area = g.kernel_h * g.kernel_w;
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const I j = i % columns, c = i / columns;
    const I image = j / plane, p = j % plane;
    const I oh = p / g.out_w, ow = p % g.out_w;
    const T* src = x + (image * channels + c) * g.in_h * g.in_w;
    T* dst = col + c * kernel_area * ld + j;
    for (I kh = 0; kh < g.kernel_h; ++kh) {
      const I ih = oh * g.stride_h - g.pad_h + kh;
      const bool row_inside = ih >= 0 && ih < g.in_h;
      for (I kw = 0; kw < g.kernel_w; ++kw) {
        const I iw = ow * g.stride_w - g.pad_w + kw;
        *dst = row_inside && iw >= 0 && iw < g.in_w ? src[ih * g.in_w + iw] : T(0);
        dst += ld;
      }
    }
  }
}

// One thread per pixel: the entries of every window position that reads it. Output row oh
// reads ih when oh·stride - pad + kh = ih, so only kh ≡ ih + pad (mod stride) contribute.
template <typename T, typename I>
__global__ void col2im_kernel(const T* col, I ld, I channels, Geometry<I> g, T* x, I total) {
  const I plane = g.out_h * g.out_w;
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const I iw = i % g.in_w, ih = (i / g.in_w) % g.in_h, image_channel = i / (g.in_w * g.in_h);
    const I image = image_channel / channels, c = image_channel % channels;
    const I h = ih + g.pad_h, w = iw + g.pad_w;  // position in the padded plane
    T total_value = T(0);
    for (I kh = h % g.stride_h; kh < g.kernel_h && kh <= h; kh += g.stride_h) {
      const I oh = (h - kh) / g.stride_h;
      if (oh >= g.out_h) continue;
      for (I kw = w % g.stride_w; kw < g.kernel_w && kw <= w; kw += g.stride_w) {
        const I ow = (w - kw) / g.stride_w;
        if (ow >= g.out_w) continue;
        total_value += col[((c * g.kernel_h + kh) * g.kernel_w + kw) * ld + image * plane + oh * g.out_w + ow];
      }
    }
    x[i] = total_value;
  }
}

template <typename T, typename I>
__global__ void columns_to_nchw_kernel(const T* mat, const T* bias, I channels, I plane, I ld, T* y, I total) {
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const I p = i % plane, o = (i / plane) % channels, image = i / (plane * channels);
    const T value = mat[o * ld + image * plane + p];
    y[i] = bias != nullptr ? value + bias[o] : value;
  }
}

template <typename T, typename I>
__global__ void nchw_to_columns_kernel(const T* y, I channels, I plane, I ld, T* mat, I total) {
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const I p = i % plane, o = (i / plane) % channels, image = i / (plane * channels);
    mat[o * ld + image * plane + p] = y[i];
  }
}

// Block o sums channel o: thread t takes elements t, t + kThreads, ... of the channel's
// count·plane values (in (g, p) order), then the block folds the kThreads partial sums as a
// fixed binary tree. The order depends only on the shape.
template <typename T>
__global__ void channel_sums_kernel(const T* y, int64_t count, int64_t channels, int64_t plane, T* sums) {
  __shared__ double partial[kThreads];
  const int64_t o = blockIdx.x;
  const int64_t n = count * plane;
  double total = 0;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const int64_t image = j / plane, p = j % plane;
    total += static_cast<double>(y[(image * channels + o) * plane + p]);
  }
  partial[threadIdx.x] = total;
  shared_tree_sum<kThreads>(partial);
  if (threadIdx.x == 0) sums[o] = static_cast<T>(partial[0]);
}

}  // namespace

template <typename T>
void im2col(const T* x, int64_t count, int64_t channels, const cpu::Window2d& win, T* col, int64_t ld,
            CUstream_st* stream) {
  const int64_t columns = count * win.out_plane();
  const int64_t total = channels * columns;
  if (total == 0) return;
  LOCKSTEP_CHECK(ld >= columns) << "im2col on a GPU: leading dimension " << ld << " is shorter than the " << columns
                                << " columns";
  const int64_t largest = std::max(count * channels * win.in_plane(), channels * win.kernel_area() * ld);
  launch_with_index_type(largest, [&](auto index) {
    using I = decltype(index);
    im2col_kernel<T, I><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        x, static_cast<I>(channels), geometry<I>(win), col, static_cast<I>(ld), static_cast<I>(columns),
        static_cast<I>(total));
  });
}

template <typename T>
void col2im(const T* col, int64_t ld, int64_t count, int64_t channels, const cpu::Window2d& win, T* x,
            CUstream_st* stream) {
  const int64_t total = count * channels * win.in_plane();
  if (total == 0) return;
  LOCKSTEP_CHECK(ld >= count * win.out_plane()) << "col2im on a GPU: leading dimension " << ld
                                                << " is shorter than the " << count * win.out_plane() << " columns";
  const int64_t largest = std::max(total, channels * win.kernel_area() * ld);
  launch_with_index_type(largest, [&](auto index) {
    using I = decltype(index);
    col2im_kernel<T, I><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        col, static_cast<I>(ld), static_cast<I>(channels), geometry<I>(win), x, static_cast<I>(total));
  });
}

template <typename T>
void columns_to_nchw(const T* mat, const T* bias, int64_t count, int64_t channels, int64_t plane, T* y,
                     CUstream_st* stream) {
  const int64_t total = count * channels * plane;
  if (total == 0) return;
  const int64_t ld = count * plane;
  launch_with_index_type(total, [&](auto index) {
    using I = decltype(index);
    columns_to_nchw_kernel<T, I><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        mat, bias, static_cast<I>(channels), static_cast<I>(plane), static_cast<I>(ld), y, static_cast<I>(total));
  });
}

template <typename T>
void nchw_to_columns(const T* y, int64_t count, int64_t channels, int64_t plane, T* mat, CUstream_st* stream) {
  const int64_t total = count * channels * plane;
  if (total == 0) return;
  const int64_t ld = count * plane;
  launch_with_index_type(total, [&](auto index) {
    using I = decltype(index);
    nchw_to_columns_kernel<T, I><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        y, static_cast<I>(channels), static_cast<I>(plane), static_cast<I>(ld), mat, static_cast<I>(total));
  });
}

template <typename T>
void channel_sums(const T* y, int64_t count, int64_t channels, int64_t plane, T* sums, CUstream_st* stream) {
  if (channels == 0) return;
  LOCKSTEP_CHECK(channels <= INT_MAX) << "channel_sums on a GPU: " << channels << " channels is more than a grid holds";
  channel_sums_kernel<T><<<static_cast<unsigned>(channels), kThreads, 0, stream>>>(y, count, channels, plane, sums);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template void im2col<float>(const float*, int64_t, int64_t, const cpu::Window2d&, float*, int64_t, CUstream_st*);
template void im2col<double>(const double*, int64_t, int64_t, const cpu::Window2d&, double*, int64_t, CUstream_st*);
template void col2im<float>(const float*, int64_t, int64_t, int64_t, const cpu::Window2d&, float*, CUstream_st*);
template void col2im<double>(const double*, int64_t, int64_t, int64_t, const cpu::Window2d&, double*, CUstream_st*);
template void columns_to_nchw<float>(const float*, const float*, int64_t, int64_t, int64_t, float*, CUstream_st*);
template void columns_to_nchw<double>(const double*, const double*, int64_t, int64_t, int64_t, double*, CUstream_st*);
template void nchw_to_columns<float>(const float*, int64_t, int64_t, int64_t, float*, CUstream_st*);
template void nchw_to_columns<double>(const double*, int64_t, int64_t, int64_t, double*, CUstream_st*);
template void channel_sums<float>(const float*, int64_t, int64_t, int64_t, float*, CUstream_st*);
template void channel_sums<double>(const double*, int64_t, int64_t, int64_t, double*, CUstream_st*);

}  // namespace lockstep::ops::cuda
