#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "lockstep/core/cuda/check.h"
#include "lockstep/ops/cuda/row_reduce.cuh"
#include "lockstep/ops/cuda/softmax_kernels.h"

namespace lockstep::ops::cuda {
namespace {

__device__ inline float exp_of(float v) { return expf(v); }
__device__ inline double exp_of(double v) { return exp(v); }
__device__ inline float log_of(float v) { return logf(v); }
__device__ inline double log_of(double v) { return log(v); }

// A row's largest element and the sum of exp(element - largest), each lane of the row's
// kGroup threads taking elements lane, lane + kGroup, ...; every thread of the group gets both.
template <typename T>
struct MaxAndExpSum {
  T max, exp_sum;
};

template <int kGroup, typename T>
__device__ MaxAndExpSum<T> max_and_exp_sum(const T* xr, int64_t n, int lane, T* scratch) {
  T m = static_cast<T>(-INFINITY);
  for (int64_t j = lane; j < n; j += kGroup) m = Max()(m, xr[j]);
  m = group_reduce<kGroup>(m, Max(), scratch);
  T s = 0;
  for (int64_t j = lane; j < n; j += kGroup) s += exp_of(xr[j] - m);
  s = group_reduce<kGroup>(s, Sum(), scratch);
  return {m, s};
}

// Calls body(base) for every column of [outer, n, inner] that this thread owns (one thread a
// column, strided over the grid): the column's elements lie at base + r·inner for r in
// [0, n). Neighbouring threads take neighbouring columns, so the loads coalesce.
template <typename Body>
__device__ void for_each_column(int64_t outer, int64_t n, int64_t inner, const Body& body) {
  const int64_t columns = outer * inner;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < columns;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    body((i / inner) * n * inner + i % inner);
  }
}

// Rows of a contiguous axis: kGroup threads per row (a warp or the block).
template <typename T, int kGroup>
__global__ void __launch_bounds__(kRowBlock)
    softmax_rows_kernel(const T* x, T* y, int64_t rows, int64_t n, bool take_log) {
  __shared__ T scratch[kWarpsPerRowBlock];
  for_each_row<kGroup>(rows, [&](int64_t row, int lane) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    const auto [m, s] = max_and_exp_sum<kGroup>(xr, n, lane, scratch);
    if (take_log) {
      const T log_s = log_of(s);
      for (int64_t j = lane; j < n; j += kGroup) yr[j] = (xr[j] - m) - log_s;
    } else {
      const T inv = T(1) / s;
      for (int64_t j = lane; j < n; j += kGroup) yr[j] = exp_of(xr[j] - m) * inv;
    }
  });
}

// A strided axis (inner > 1): one thread per (outer, inner) column walks the n elements in
// order.
template <typename T>
__global__ void softmax_columns_kernel(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool take_log) {
  for_each_column(outer, n, inner, [&](int64_t base) {
    const T* xc = x + base;
    T* yc = y + base;
    T m = static_cast<T>(-INFINITY);
    for (int64_t r = 0; r < n; ++r) m = Max()(m, xc[r * inner]);
    T s = 0;
    for (int64_t r = 0; r < n; ++r) s += exp_of(xc[r * inner] - m);
    if (take_log) {
      const T log_s = log_of(s);
      for (int64_t r = 0; r < n; ++r) yc[r * inner] = (xc[r * inner] - m) - log_s;
    } else {
      const T inv = T(1) / s;
      for (int64_t r = 0; r < n; ++r) yc[r * inner] = exp_of(xc[r * inner] - m) * inv;
    }
  });
}

template <typename T, int kGroup>
__global__ void __launch_bounds__(kRowBlock)
    softmax_backward_rows_kernel(const T* grad, const T* y, T* grad_x, int64_t rows, int64_t n, bool take_log) {
  __shared__ T scratch[kWarpsPerRowBlock];
  for_each_row<kGroup>(rows, [&](int64_t row, int lane) {
    const T* g = grad + row * n;
    const T* yr = y + row * n;
    T* gx = grad_x + row * n;
    T s = 0;
    if (take_log) {
      for (int64_t j = lane; j < n; j += kGroup) s += g[j];
    } else {
      for (int64_t j = lane; j < n; j += kGroup) s += g[j] * yr[j];
    }
    s = group_reduce<kGroup>(s, Sum(), scratch);
    if (take_log) {
      for (int64_t j = lane; j < n; j += kGroup) gx[j] = g[j] - exp_of(yr[j]) * s;
    } else {
      for (int64_t j = lane; j < n; j += kGroup) gx[j] = yr[j] * (g[j] - s);
    }
  });
}

template <typename T>
__global__ void softmax_backward_columns_kernel(const T* grad, const T* y, T* grad_x, int64_t outer, int64_t n,
                                                int64_t inner, bool take_log) {
  for_each_column(outer, n, inner, [&](int64_t base) {
    const T* g = grad + base;
    const T* yc = y + base;
    T* gx = grad_x + base;
    T s = 0;
    for (int64_t r = 0; r < n; ++r) s += take_log ? g[r * inner] : g[r * inner] * yc[r * inner];
    for (int64_t r = 0; r < n; ++r) {
      const int64_t k = r * inner;
      gx[k] = take_log ? g[k] - exp_of(yc[k]) * s : yc[k] * (g[k] - s);
    }
  });
}

// Like softmax_rows_kernel up to the row's log-sum-exp; one thread per row then writes the
// loss, or flags the row when its label is out of range (without reading past the row).
template <typename T, typename Label, int kGroup>
__global__ void __launch_bounds__(kRowBlock)
    cross_entropy_rows_kernel(const T* logits, const Label* labels, int64_t rows, int64_t classes, T* losses, T* lse,
                              unsigned long long* first_bad_row) {
  __shared__ T scratch[kWarpsPerRowBlock];
  for_each_row<kGroup>(rows, [&](int64_t row, int lane) {
    const T* xr = logits + row * classes;
    const auto [m, s] = max_and_exp_sum<kGroup>(xr, classes, lane, scratch);
    if (lane == 0) {
      const T row_lse = m + log_of(s);
      const int64_t label = static_cast<int64_t>(labels[row]);
      lse[row] = row_lse;
      if (label >= 0 && label < classes) {
        losses[row] = row_lse - xr[label];
      } else {
        losses[row] = static_cast<T>(NAN);
        // Only which row is first matters, and a minimum does not depend on the order.
        atomicMin(first_bad_row, static_cast<unsigned long long>(row));
      }
    }
  });
}

template <typename T>
__global__ void __launch_bounds__(kRowBlock) sum_losses_kernel(const T* losses, int64_t rows, bool mean, T* out) {
  __shared__ T scratch[kWarpsPerRowBlock];
  T s = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kRowBlock) s += losses[i];
  s = block_reduce(s, Sum(), scratch);
  if (threadIdx.x == 0) out[0] = mean ? s / static_cast<T>(rows) : s;
}

// One block per row (strided over the grid), its threads over the classes.
template <typename T, typename Label>
__global__ void cross_entropy_backward_kernel(const T* logits, const Label* labels, const T* lse, const T* scale,
                                              int64_t scale_stride, T divisor, int64_t rows, int64_t classes, T* grad) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T s = scale[row * scale_stride] / divisor;
    const T l = lse[row];
    const int64_t label = static_cast<int64_t>(labels[row]);
    const T* xr = logits + row * classes;
    T* gr = grad + row * classes;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
      T v = exp_of(xr[j] - l) * s;
      if (j == label) v -= s;
      gr[j] = v;
    }
  }
}

}  // namespace

template <typename T>
void softmax_forward(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool take_log, CUstream_st* stream) {
  if (outer == 0 || n == 0 || inner == 0) return;
  if (inner == 1) {
    launch_by_row_length(n, [&](auto group) {
      constexpr int kGroup = decltype(group)::value;
      softmax_rows_kernel<T, kGroup><<<row_blocks(outer, kGroup), kRowBlock, 0, stream>>>(x, y, outer, n, take_log);
    });
    return;
  }
  softmax_columns_kernel<T>
      <<<::lockstep::cuda::grid_for(outer * inner, kRowBlock), kRowBlock, 0, stream>>>(x, y, outer, n, inner, take_log);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void softmax_backward(const T* grad, const T* y, T* grad_x, int64_t outer, int64_t n, int64_t inner, bool take_log,
                      CUstream_st* stream) {
  if (outer == 0 || n == 0 || inner == 0) return;
  if (inner == 1) {
    launch_by_row_length(n, [&](auto group) {
      constexpr int kGroup = decltype(group)::value;
      softmax_backward_rows_kernel<T, kGroup>
          <<<row_blocks(outer, kGroup), kRowBlock, 0, stream>>>(grad, y, grad_x, outer, n, take_log);
    });
    return;
  }
  softmax_backward_columns_kernel<T><<<::lockstep::cuda::grid_for(outer * inner, kRowBlock), kRowBlock, 0, stream>>>(
      grad, y, grad_x, outer, n, inner, take_log);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T, typename Label>
void cross_entropy_forward(const T* logits, const Label* labels, int64_t rows, int64_t classes, T* losses, T* lse,
                           int64_t* first_bad_row, CUstream_st* stream) {
  // All bits set: -1 as an int64, and above every row index for the unsigned atomicMin.
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(first_bad_row, 0xff, sizeof(int64_t), stream));
  if (rows == 0) return;
  auto* flag = reinterpret_cast<unsigned long long*>(first_bad_row);
  launch_by_row_length(classes, [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    cross_entropy_rows_kernel<T, Label, kGroup>
        <<<row_blocks(rows, kGroup), kRowBlock, 0, stream>>>(logits, labels, rows, classes, losses, lse, flag);
  });
}

template <typename T>
void sum_losses(const T* losses, int64_t rows, bool mean, T* out, CUstream_st* stream) {
  sum_losses_kernel<T><<<1, kRowBlock, 0, stream>>>(losses, rows, mean, out);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T, typename Label>
void cross_entropy_backward(const T* logits, const Label* labels, const T* lse, const T* scale, int64_t scale_stride,
                            T divisor, int64_t rows, int64_t classes, T* grad, CUstream_st* stream) {
  if (rows == 0 || classes == 0) return;
  cross_entropy_backward_kernel<T, Label><<<row_blocks(rows, kRowBlock), kRowBlock, 0, stream>>>(
      logits, labels, lse, scale, scale_stride, divisor, rows, classes, grad);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

#define LOCKSTEP_INSTANTIATE(T)                                                                                       \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t, int64_t, bool, CUstream_st*);                      \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool, CUstream_st*);           \
  template void cross_entropy_forward<T, int32_t>(const T*, const int32_t*, int64_t, int64_t, T*, T*, int64_t*,       \
                                                  CUstream_st*);                                                      \
  template void cross_entropy_forward<T, int64_t>(const T*, const int64_t*, int64_t, int64_t, T*, T*, int64_t*,       \
                                                  CUstream_st*);                                                      \
  template void sum_losses<T>(const T*, int64_t, bool, T*, CUstream_st*);                                             \
  template void cross_entropy_backward<T, int32_t>(const T*, const int32_t*, const T*, const T*, int64_t, T, int64_t, \
                                                   int64_t, T*, CUstream_st*);                                        \
  template void cross_entropy_backward<T, int64_t>(const T*, const int64_t*, const T*, const T*, int64_t, T, int64_t, \
                                                   int64_t, T*, CUstream_st*);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::ops::cuda
