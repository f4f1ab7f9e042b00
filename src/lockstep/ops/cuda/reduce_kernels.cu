#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "lockstep/core/cuda/check.h"
#include "lockstep/core/error.h"
#include "lockstep/ops/cuda/reduce_kernels.h"

namespace lockstep::ops::cuda {
namespace {

using lockstep::cuda::grid_for;

constexpr int kWarp = 32;
constexpr int kThreads = 256;  // the row kernels' trees are written for exactly this block size
constexpr int kWarps = kThreads / kWarp;
constexpr unsigned kFullMask = 0xffffffffu;

// Rows up to this long are summed by one warp each, longer ones by a block each.
constexpr int64_t kWarpRowMax = 256;
// Rows longer than this are cut into parts of this many elements (32 per thread), summed by
// one block each, and the part sums of each row are added by a second pass.
constexpr int64_t kRowPart = 8192;
// A column sum (inner > 1) with fewer outputs than this cuts its rows into parts so that
// about this many threads run; parts keep at least kMinPartRows rows and number at most
// kMaxParts, so the second pass adds at most kMaxParts terms per output.
constexpr int64_t kEnoughOutputs = 65536;
constexpr int64_t kMinPartRows = 32;
constexpr int64_t kMaxParts = 1024;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How sum_middle splits its middle axis, from the shape alone: `parts` parts of `part_len`
// elements (inner == 1) or rows (inner > 1); the last may be shorter.
struct SumPlan {
  int64_t parts = 1;
  int64_t part_len = 0;
};

SumPlan plan_sum(int64_t outer, int64_t n, int64_t inner) {
  SumPlan plan{1, n};
  if (inner == 1) {
    if (n > kRowPart) plan = {ceil_div(n, kRowPart), kRowPart};
    return plan;
  }
  const int64_t outputs = outer * inner;
  if (outputs >= kEnoughOutputs || n < 2 * kMinPartRows) return plan;
  const int64_t parts = std::min({ceil_div(n, kMinPartRows), ceil_div(kEnoughOutputs, outputs), kMaxParts});
  if (parts <= 1) return plan;
  const int64_t part_len = ceil_div(n, parts);
  return {ceil_div(n, part_len), part_len};
}

// ---- Fixed-order trees. Lane i adds lane i + offset's value for offsets 16, 8, 4, 2, 1:
// lane 0 ends with the sum, always combined in the same pairs.

template <typename T>
__device__ T warp_sum(T v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_down_sync(kFullMask, v, offset);
  return v;
}

// The sum of every thread's v in thread 0 (blockDim.x == kThreads, called by the whole block).
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T partial[kWarps];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) v = warp_sum(lane < kWarps ? partial[lane] : T(0));
  __syncthreads();  // partial is free again for the block's next row
  return v;
}

// ---- Sums.

// Row r of [rows = outer * parts]: part r % parts of row r / parts of x [outer, n], summed
// into out[r]. Thread t adds elements t, t + 256, ... of the part in order, then the tree.
template <typename T>
__global__ void sum_rows_block_kernel(const T* __restrict__ x, int64_t n, int64_t part_len, int64_t parts, int64_t rows,
                                      T* __restrict__ out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t o = r / parts, begin = r % parts * part_len;
    const int64_t len = min(part_len, n - begin);
    const T* src = x + o * n + begin;
    T acc = T(0);
    for (int64_t i = threadIdx.x; i < len; i += kThreads) acc += src[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[r] = acc;
  }
}

// Each warp sums whole rows of x [rows, n] (short rows), lane l adding elements l, l + 32, ...
template <typename T>
__global__ void sum_rows_warp_kernel(const T* __restrict__ x, int64_t n, int64_t rows, T* __restrict__ out) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / kWarp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const T* src = x + r * n;
    T acc = T(0);
    for (int64_t i = lane; i < n; i += kWarp) acc += src[i];
    acc = warp_sum(acc);
    if (lane == 0) out[r] = acc;
  }
}

// x [outer, n, inner] with n cut into `parts` parts of part_len rows: out [outer, parts,
// inner], each element the sum of its part's rows in order. One thread per output, so
// neighbouring threads read neighbouring columns.
template <typename T>
__global__ void sum_columns_kernel(const T* __restrict__ x, int64_t outer, int64_t n, int64_t inner, int64_t part_len,
                                   int64_t parts, T* __restrict__ out) {
  const int64_t total = outer * parts * inner;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = k % inner, rest = k / inner;
    const int64_t p = rest % parts, o = rest / parts;
    const int64_t r0 = p * part_len, r1 = min(n, r0 + part_len);
    const T* src = x + (o * n + r0) * inner + j;
    T acc = T(0);
    for (int64_t r = r0; r < r1; ++r, src += inner) acc += *src;
    out[k] = acc;
  }
}

// Whole rows of x [rows, n] summed into out[rows], a warp or a block per row by length.
template <typename T>
void launch_sum_rows(const T* x, int64_t rows, int64_t n, T* out, cudaStream_t stream) {
  if (n <= kWarpRowMax) {
    sum_rows_warp_kernel<<<grid_for(rows, kWarps), kThreads, 0, stream>>>(x, n, rows, out);
  } else {
    sum_rows_block_kernel<<<grid_for(rows, 1), kThreads, 0, stream>>>(x, n, n, int64_t{1}, rows, out);
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_sum_columns(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t part_len, int64_t parts, T* out,
                        cudaStream_t stream) {
  sum_columns_kernel<<<grid_for(outer * parts * inner, kThreads), kThreads, 0, stream>>>(x, outer, n, inner, part_len,
                                                                                         parts, out);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
__global__ void divide_kernel(T* x, int64_t n, T divisor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] /= divisor;
}

// ---- Max and its first index.

// Whether candidate (b, ib) beats (a, ia): a nan beats any number, a larger value beats a
// smaller one, and among equals (or nans) the lower index wins; index -1 is no candidate.
// The winner of any set is the first position the CPU picks, whatever order pairs meet in.
template <typename T>
__device__ bool beats(T b, int64_t ib, T a, int64_t ia) {
  if (ib < 0) return false;
  if (ia < 0) return true;
  const bool b_nan = b != b, a_nan = a != a;
  if (b_nan || a_nan) return b_nan && (!a_nan || ib < ia);
  if (b != a) return b > a;
  return ib < ia;
}

template <typename T>
__device__ void warp_max(T& value, int64_t& index) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const T other = __shfl_down_sync(kFullMask, value, offset);
    const int64_t other_index = __shfl_down_sync(kFullMask, index, offset);
    if (beats(other, other_index, value, index)) {
      value = other;
      index = other_index;
    }
  }
}

template <typename T>
__device__ void scan_max(const T* row, int64_t begin, int64_t n, int64_t step, T& value, int64_t& index) {
  for (int64_t i = begin; i < n; i += step) {
    const T v = row[i];
    if (beats(v, i, value, index)) {
      value = v;
      index = i;
    }
  }
}

template <typename T>
__global__ void max_rows_warp_kernel(const T* __restrict__ x, int64_t n, int64_t rows, T* __restrict__ values,
                                     int64_t* __restrict__ indices) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / kWarp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    T value = T(0);
    int64_t index = -1;
    scan_max(x + r * n, lane, n, kWarp, value, index);
    warp_max(value, index);
    if (lane == 0) {
      if (values != nullptr) values[r] = value;
      indices[r] = index;
    }
  }
}

template <typename T>
__global__ void max_rows_block_kernel(const T* __restrict__ x, int64_t n, int64_t rows, T* __restrict__ values,
                                      int64_t* __restrict__ indices) {
  __shared__ T partial_value[kWarps];
  __shared__ int64_t partial_index[kWarps];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T value = T(0);
    int64_t index = -1;
    scan_max(x + r * n, threadIdx.x, n, kThreads, value, index);
    warp_max(value, index);
    if (lane == 0) {
      partial_value[warp] = value;
      partial_index[warp] = index;
    }
    __syncthreads();
    if (warp == 0) {
      value = lane < kWarps ? partial_value[lane] : T(0);
      index = lane < kWarps ? partial_index[lane] : -1;
      warp_max(value, index);
      if (lane == 0) {
        if (values != nullptr) values[r] = value;
        indices[r] = index;
      }
    }
    __syncthreads();
  }
}

// One thread per (outer, column), scanning the middle axis in order as the CPU does.
template <typename T>
__global__ void max_columns_kernel(const T* __restrict__ x, int64_t outer, int64_t n, int64_t inner,
                                   T* __restrict__ values, int64_t* __restrict__ indices) {
  const int64_t total = outer * inner;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = k % inner, o = k / inner;
    const T* src = x + o * n * inner + j;
    T best = src[0];
    int64_t best_index = 0;
    for (int64_t r = 1; r < n; ++r) {
      const T v = src[r * inner];
      if (v > best || (v != v && best == best)) {
        best = v;
        best_index = r;
      }
    }
    if (values != nullptr) values[k] = best;
    indices[k] = best_index;
  }
}

template <typename T>
__global__ void max_backward_kernel(const T* __restrict__ grad, const int64_t* __restrict__ indices, int64_t outer,
                                    int64_t n, int64_t inner, T* __restrict__ grad_x) {
  const int64_t total = outer * n * inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i % inner, rest = i / inner;
    const int64_t r = rest % n, o = rest / n;
    const int64_t k = o * inner + j;
    grad_x[i] = indices[k] == r ? grad[k] : T(0);
  }
}

}  // namespace

int64_t sum_middle_workspace(int64_t outer, int64_t n, int64_t inner) {
  if (outer <= 0 || inner <= 0 || n <= 0) return 0;
  const SumPlan plan = plan_sum(outer, n, inner);
  return plan.parts > 1 ? outer * plan.parts * inner : 0;
}

template <typename T>
void sum_middle(const T* x, int64_t outer, int64_t n, int64_t inner, T* out, T* workspace, CUstream_st* stream) {
  if (outer <= 0 || inner <= 0) return;
  if (n == 0) {
    LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(outer * inner) * sizeof(T), stream));
    return;
  }
  const SumPlan plan = plan_sum(outer, n, inner);
  LOCKSTEP_CHECK(plan.parts == 1 || workspace != nullptr)
      << "sum_middle: a sum of " << n << " terms needs a workspace of " << sum_middle_workspace(outer, n, inner)
      << " elements, got none";
  if (inner == 1) {
    if (plan.parts == 1) return launch_sum_rows(x, outer, n, out, stream);
    const int64_t rows = outer * plan.parts;
    sum_rows_block_kernel<<<grid_for(rows, 1), kThreads, 0, stream>>>(x, n, plan.part_len, plan.parts, rows, workspace);
    LOCKSTEP_CUDA_CHECK(cudaGetLastError());
    return launch_sum_rows(static_cast<const T*>(workspace), outer, plan.parts, out, stream);
  }
  if (plan.parts == 1) return launch_sum_columns(x, outer, n, inner, n, int64_t{1}, out, stream);
  launch_sum_columns(x, outer, n, inner, plan.part_len, plan.parts, workspace, stream);
  launch_sum_columns(static_cast<const T*>(workspace), outer, plan.parts, inner, plan.parts, int64_t{1}, out, stream);
}

template <typename T>
void divide(T* x, int64_t n, T divisor, CUstream_st* stream) {
  if (n <= 0) return;
  divide_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, divisor);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void max_middle(const T* x, int64_t outer, int64_t n, int64_t inner, T* values, int64_t* indices, CUstream_st* stream) {
  if (outer <= 0 || inner <= 0) return;
  LOCKSTEP_CHECK(n >= 1) << "max_middle: the axis is empty, so it has no largest value";
  if (inner > 1) {
    max_columns_kernel<<<grid_for(outer * inner, kThreads), kThreads, 0, stream>>>(x, outer, n, inner, values, indices);
  } else if (n <= kWarpRowMax) {
    max_rows_warp_kernel<<<grid_for(outer, kWarps), kThreads, 0, stream>>>(x, n, outer, values, indices);
  } else {
    max_rows_block_kernel<<<grid_for(outer, 1), kThreads, 0, stream>>>(x, n, outer, values, indices);
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void max_backward(const T* grad, const int64_t* indices, int64_t outer, int64_t n, int64_t inner, T* grad_x,
                  CUstream_st* stream) {
  const int64_t total = outer * n * inner;
  if (total <= 0) return;
  max_backward_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(grad, indices, outer, n, inner, grad_x);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

#define LOCKSTEP_INSTANTIATE(T)                                                                 \
  template void sum_middle<T>(const T*, int64_t, int64_t, int64_t, T*, T*, CUstream_st*);       \
  template void divide<T>(T*, int64_t, T, CUstream_st*);                                        \
  template void max_middle<T>(const T*, int64_t, int64_t, int64_t, T*, int64_t*, CUstream_st*); \
  template void max_backward<T>(const T*, const int64_t*, int64_t, int64_t, int64_t, T*, CUstream_st*);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::ops::cuda
