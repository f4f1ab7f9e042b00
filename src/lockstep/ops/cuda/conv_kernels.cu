#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "lockstep/core/cuda/check.h"
#include "lockstep/core/error.h"
#include "lockstep/ops/cuda/conv_kernels.h"

namespace lockstep::ops::cuda {
namespace {

using lockstep::cuda::grid_for;

constexpr int kThreads = 256;

// Window2d's numbers in the index type the kernel computes with: 32-bit where every index
// fits (integer division is several times cheaper), else 64-bit.
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

// Whether 32-bit indices hold every index a kernel forms, with room for the last grid-stride
// step past the end (at most grid_for's 65535·8 blocks of kThreads).
bool fits_int32(int64_t largest) { return largest <= INT_MAX / 2; }

// A grid-stride loop's first index and step, in the kernel's index type.
template <typename I>
__device__ I first_index() {
  return static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
}
template <typename I>
__device__ I grid_stride() {
  return static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
}

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
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
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
  if (fits_int32(largest)) {
    im2col_kernel<T, int32_t><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        x, static_cast<int32_t>(channels), geometry<int32_t>(win), col, static_cast<int32_t>(ld),
        static_cast<int32_t>(columns), static_cast<int32_t>(total));
  } else {
    im2col_kernel<T, int64_t><<<grid_for(total, kThreads), kThreads, 0, stream>>>(x, channels, geometry<int64_t>(win),
                                                                                  col, ld, columns, total);
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void col2im(const T* col, int64_t ld, int64_t count, int64_t channels, const cpu::Window2d& win, T* x,
            CUstream_st* stream) {
  const int64_t total = count * channels * win.in_plane();
  if (total == 0) return;
  LOCKSTEP_CHECK(ld >= count * win.out_plane()) << "col2im on a GPU: leading dimension " << ld
                                                << " is shorter than the " << count * win.out_plane() << " columns";
  const int64_t largest = std::max(total, channels * win.kernel_area() * ld);
  if (fits_int32(largest)) {
    col2im_kernel<T, int32_t><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        col, static_cast<int32_t>(ld), static_cast<int32_t>(channels), geometry<int32_t>(win), x,
        static_cast<int32_t>(total));
  } else {
    col2im_kernel<T, int64_t>
        <<<grid_for(total, kThreads), kThreads, 0, stream>>>(col, ld, channels, geometry<int64_t>(win), x, total);
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void columns_to_nchw(const T* mat, const T* bias, int64_t count, int64_t channels, int64_t plane, T* y,
                     CUstream_st* stream) {
  const int64_t total = count * channels * plane;
  if (total == 0) return;
  const int64_t ld = count * plane;
  if (fits_int32(total)) {
    columns_to_nchw_kernel<T, int32_t><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        mat, bias, static_cast<int32_t>(channels), static_cast<int32_t>(plane), static_cast<int32_t>(ld), y,
        static_cast<int32_t>(total));
  } else {
    columns_to_nchw_kernel<T, int64_t>
        <<<grid_for(total, kThreads), kThreads, 0, stream>>>(mat, bias, channels, plane, ld, y, total);
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void nchw_to_columns(const T* y, int64_t count, int64_t channels, int64_t plane, T* mat, CUstream_st* stream) {
  const int64_t total = count * channels * plane;
  if (total == 0) return;
  const int64_t ld = count * plane;
  if (fits_int32(total)) {
    nchw_to_columns_kernel<T, int32_t><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        y, static_cast<int32_t>(channels), static_cast<int32_t>(plane), static_cast<int32_t>(ld), mat,
        static_cast<int32_t>(total));
  } else {
    nchw_to_columns_kernel<T, int64_t>
        <<<grid_for(total, kThreads), kThreads, 0, stream>>>(y, channels, plane, ld, mat, total);
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
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
