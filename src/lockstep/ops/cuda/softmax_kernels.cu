#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "lockstep/core/cuda/check.h"
#include "lockstep/ops/cuda/softmax_kernels.h"

namespace lockstep::ops::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kBlock / kWarp;
// Rows up to this long get one warp each (at most 32 elements a lane); longer rows a block.
constexpr int64_t kWarpRowLimit = 1024;

__device__ inline float exp_of(float v) { return expf(v); }
__device__ inline double exp_of(double v) { return exp(v); }
__device__ inline float log_of(float v) { return logf(v); }
__device__ inline double log_of(double v) { return log(v); }

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// fmax ignores a NaN operand and is symmetric, so every lane of a butterfly ends with the
// same maximum; a NaN element still makes its row NaN through the exp sum.
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
};

// A butterfly over the 32 lanes: the same tree every call, the same total in every lane.
template <typename T, typename Op>
__device__ T warp_reduce(T v, Op op) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Every thread of the block calls this; each gets the same total: the warps' totals folded
// in warp order. scratch holds kWarpsPerBlock values.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T* scratch) {
  v = warp_reduce(v, op);
  __syncthreads();  // the previous call's readers are done with scratch
  if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = v;
  __syncthreads();
  T total = scratch[0];
  for (int w = 1; w < kWarpsPerBlock; ++w) total = op(total, scratch[w]);
  return total;
}

// The total over the kGroup threads that share a row: a warp, or the whole block.
template <int kGroup, typename T, typename Op>
__device__ T group_reduce(T v, Op op, T* scratch) {
  if constexpr (kGroup == kWarp) {
    (void)scratch;
    return warp_reduce(v, op);
  } else {
    static_assert(kGroup == kBlock, "a row belongs to a warp or to the whole block");
    return block_reduce(v, op, scratch);
  }
}

// Rows of a contiguous axis: kGroup threads per row (a warp or the block), rows strided over
// the grid. The loop bound is the same for every thread of a group, so the block-wide
// reductions are reached by all of its threads.
template <typename T, int kGroup>
__global__ void __launch_bounds__(kBlock)
    softmax_rows_kernel(const T* x, T* y, int64_t rows, int64_t n, bool take_log) {
  __shared__ T scratch[kWarpsPerBlock];
  constexpr int kRowsPerBlock = kBlock / kGroup;
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kGroup; row < rows; row += step) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    T m = static_cast<T>(-INFINITY);
    for (int64_t j = lane; j < n; j += kGroup) m = Max()(m, xr[j]);
    m = group_reduce<kGroup>(m, Max(), scratch);
    T s = 0;
    for (int64_t j = lane; j < n; j += kGroup) s += exp_of(xr[j] - m);
    s = group_reduce<kGroup>(s, Sum(), scratch);
    if (take_log) {
      const T log_s = log_of(s);
      for (int64_t j = lane; j < n; j += kGroup) yr[j] = (xr[j] - m) - log_s;
    } else {
      const T inv = T(1) / s;
      for (int64_t j = lane; j < n; j += kGroup) yr[j] = exp_of(xr[j] - m) * inv;
    }
  }
}

// A strided axis (inner > 1): one thread per (outer, inner) column walks the n elements in
// order; neighbouring threads read neighbouring columns, so the loads coalesce.
template <typename T>
__global__ void softmax_columns_kernel(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool take_log) {
  const int64_t columns = outer * inner;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < columns;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = (i / inner) * n * inner + i % inner;
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
  }
}

template <typename T, int kGroup>
__global__ void __launch_bounds__(kBlock)
    softmax_backward_rows_kernel(const T* grad, const T* y, T* grad_x, int64_t rows, int64_t n, bool take_log) {
  __shared__ T scratch[kWarpsPerBlock];
  constexpr int kRowsPerBlock = kBlock / kGroup;
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kGroup; row < rows; row += step) {
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
  }
}

template <typename T>
__global__ void softmax_backward_columns_kernel(const T* grad, const T* y, T* grad_x, int64_t outer, int64_t n,
                                                int64_t inner, bool take_log) {
  const int64_t columns = outer * inner;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < columns;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = (i / inner) * n * inner + i % inner;
    const T* g = grad + base;
    const T* yc = y + base;
    T* gx = grad_x + base;
    T s = 0;
    for (int64_t r = 0; r < n; ++r) s += take_log ? g[r * inner] : g[r * inner] * yc[r * inner];
    for (int64_t r = 0; r < n; ++r) {
      const int64_t k = r * inner;
      gx[k] = take_log ? g[k] - exp_of(yc[k]) * s : yc[k] * (g[k] - s);
    }
  }
}

// Like softmax_rows_kernel up to the row's log-sum-exp; one thread per row then writes the
// loss, or flags the row when its label is out of range (without reading past the row).
template <typename T, typename Label, int kGroup>
__global__ void __launch_bounds__(kBlock)
    cross_entropy_rows_kernel(const T* logits, const Label* labels, int64_t rows, int64_t classes, T* losses, T* lse,
                              unsigned long long* first_bad_row) {
  __shared__ T scratch[kWarpsPerBlock];
  constexpr int kRowsPerBlock = kBlock / kGroup;
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kGroup; row < rows; row += step) {
    const T* xr = logits + row * classes;
    T m = static_cast<T>(-INFINITY);
    for (int64_t j = lane; j < classes; j += kGroup) m = Max()(m, xr[j]);
    m = group_reduce<kGroup>(m, Max(), scratch);
    T s = 0;
    for (int64_t j = lane; j < classes; j += kGroup) s += exp_of(xr[j] - m);
    s = group_reduce<kGroup>(s, Sum(), scratch);
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
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlock) sum_losses_kernel(const T* losses, int64_t rows, bool mean, T* out) {
  __shared__ T scratch[kWarpsPerBlock];
  T s = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kBlock) s += losses[i];
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

// Blocks for `rows` rows of kGroup threads each (grid-stride beyond the cap).
unsigned row_blocks(int64_t rows, int group) { return ::lockstep::cuda::grid_for(rows * group, kBlock); }

}  // namespace

template <typename T>
void softmax_forward(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool take_log, CUstream_st* stream) {
  if (outer == 0 || n == 0 || inner == 0) return;
  if (inner == 1) {
    if (n <= kWarpRowLimit) {
      softmax_rows_kernel<T, kWarp><<<row_blocks(outer, kWarp), kBlock, 0, stream>>>(x, y, outer, n, take_log);
    } else {
      softmax_rows_kernel<T, kBlock><<<row_blocks(outer, kBlock), kBlock, 0, stream>>>(x, y, outer, n, take_log);
    }
  } else {
    softmax_columns_kernel<T>
        <<<::lockstep::cuda::grid_for(outer * inner, kBlock), kBlock, 0, stream>>>(x, y, outer, n, inner, take_log);
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void softmax_backward(const T* grad, const T* y, T* grad_x, int64_t outer, int64_t n, int64_t inner, bool take_log,
                      CUstream_st* stream) {
  if (outer == 0 || n == 0 || inner == 0) return;
  if (inner == 1) {
    if (n <= kWarpRowLimit) {
      softmax_backward_rows_kernel<T, kWarp>
          <<<row_blocks(outer, kWarp), kBlock, 0, stream>>>(grad, y, grad_x, outer, n, take_log);
    } else {
      softmax_backward_rows_kernel<T, kBlock>
          <<<row_blocks(outer, kBlock), kBlock, 0, stream>>>(grad, y, grad_x, outer, n, take_log);
    }
  } else {
    softmax_backward_columns_kernel<T><<<::lockstep::cuda::grid_for(outer * inner, kBlock), kBlock, 0, stream>>>(
        grad, y, grad_x, outer, n, inner, take_log);
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T, typename Label>
void cross_entropy_forward(const T* logits, const Label* labels, int64_t rows, int64_t classes, T* losses, T* lse,
                           int64_t* first_bad_row, CUstream_st* stream) {
  // All bits set: -1 as an int64, and above every row index for the unsigned atomicMin.
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(first_bad_row, 0xff, sizeof(int64_t), stream));
  if (rows == 0) return;
  auto* flag = reinterpret_cast<unsigned long long*>(first_bad_row);
  if (classes <= kWarpRowLimit) {
    cross_entropy_rows_kernel<T, Label, kWarp>
        <<<row_blocks(rows, kWarp), kBlock, 0, stream>>>(logits, labels, rows, classes, losses, lse, flag);
  } else {
    cross_entropy_rows_kernel<T, Label, kBlock>
        <<<row_blocks(rows, kBlock), kBlock, 0, stream>>>(logits, labels, rows, classes, losses, lse, flag);
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void sum_losses(const T* losses, int64_t rows, bool mean, T* out, CUstream_st* stream) {
  sum_losses_kernel<T><<<1, kBlock, 0, stream>>>(losses, rows, mean, out);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T, typename Label>
void cross_entropy_backward(const T* logits, const Label* labels, const T* lse, const T* scale, int64_t scale_stride,
                            T divisor, int64_t rows, int64_t classes, T* grad, CUstream_st* stream) {
  if (rows == 0 || classes == 0) return;
  cross_entropy_backward_kernel<T, Label><<<row_blocks(rows, kBlock), kBlock, 0, stream>>>(
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
