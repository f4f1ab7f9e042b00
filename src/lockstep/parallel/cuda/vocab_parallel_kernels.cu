#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "lockstep/core/cuda/check.h"
#include "lockstep/ops/cuda/row_reduce.cuh"
#include "lockstep/parallel/cuda/vocab_parallel_kernels.h"

namespace lockstep::parallel::cuda {
namespace {

using ops::cuda::for_each_row;
using ops::cuda::group_reduce;
using ops::cuda::kRowBlock;
using ops::cuda::kWarpsPerRowBlock;
using ops::cuda::launch_by_row_length;
using ops::cuda::Max;
using ops::cuda::row_blocks;
using ops::cuda::Sum;

// This rank's column of row i's target, or -1 when another rank holds it.
__device__ inline int64_t local_column(const int64_t* targets, int64_t row, int64_t first, int64_t columns) {
  const int64_t local = targets[row] - first;
  return local >= 0 && local < columns ? local : -1;
}

template <int kGroup>
__global__ void __launch_bounds__(kRowBlock)
    row_max_kernel(const float* logits, int64_t rows, int64_t columns, float* row_max) {
  __shared__ float scratch[kWarpsPerRowBlock];
  for_each_row<kGroup>(rows, [&](int64_t row, int lane) {
    const float* x = logits + row * columns;
    float m = -INFINITY;
    for (int64_t j = lane; j < columns; j += kGroup) m = Max()(m, x[j]);
    m = group_reduce<kGroup>(m, Max(), scratch);
    if (lane == 0) row_max[row] = m;
  });
}

template <int kGroup>
__global__ void __launch_bounds__(kRowBlock)
    exp_sums_kernel(const float* logits, const int64_t* targets, int64_t rows, int64_t columns, int64_t first,
                    const float* row_max, float* exps, float* sums, float* picked) {
  __shared__ float scratch[kWarpsPerRowBlock];
  for_each_row<kGroup>(rows, [&](int64_t row, int lane) {
    const float* x = logits + row * columns;
    float* e = exps + row * columns;
    const float m = row_max[row];
    float s = 0;
    for (int64_t j = lane; j < columns; j += kGroup) {
      e[j] = expf(x[j] - m);
      s += e[j];
    }
    s = group_reduce<kGroup>(s, Sum(), scratch);
    if (lane == 0) {
      sums[row] = s;
      const int64_t local = local_column(targets, row, first, columns);
      picked[row] = local >= 0 ? x[local] - m : 0.0f;
    }
  });
}

__global__ void losses_kernel(float* exps, const float* sums, const float* picked, int64_t rows, int64_t columns,
                              float* losses) {
  const int64_t total = rows * columns;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int64_t row = k / columns;
    exps[k] /= sums[row];
    if (k % columns == 0) losses[row] = logf(sums[row]) - picked[row];
  }
}

__global__ void gradient_kernel(const float* probabilities, const int64_t* targets, const float* upstream, int64_t rows,
                                int64_t columns, int64_t first, float* grad) {
  const int64_t total = rows * columns;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int64_t row = k / columns;
    float g = probabilities[k];
    if (k % columns == local_column(targets, row, first, columns)) g -= 1.0f;
    grad[k] = g * upstream[row];
  }
}

constexpr int kThreads = 256;

}  // namespace

void vocab_row_max(const float* logits, int64_t rows, int64_t columns, float* row_max, CUstream_st* stream) {
  if (rows == 0) return;
  launch_by_row_length(columns, [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    row_max_kernel<kGroup><<<row_blocks(rows, kGroup), kRowBlock, 0, stream>>>(logits, rows, columns, row_max);
  });
}

void vocab_exp_sums(const float* logits, const int64_t* targets, int64_t rows, int64_t columns, int64_t first,
                    const float* row_max, float* exps, float* sums, float* picked, CUstream_st* stream) {
  if (rows == 0) return;
  launch_by_row_length(columns, [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    exp_sums_kernel<kGroup><<<row_blocks(rows, kGroup), kRowBlock, 0, stream>>>(logits, targets, rows, columns, first,
                                                                                row_max, exps, sums, picked);
  });
}

void vocab_losses(float* exps, const float* sums, const float* picked, int64_t rows, int64_t columns, float* losses,
                  CUstream_st* stream) {
  if (rows == 0 || columns == 0) return;
  losses_kernel<<<::lockstep::cuda::grid_for(rows * columns, kThreads), kThreads, 0, stream>>>(exps, sums, picked, rows,
                                                                                               columns, losses);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

void vocab_gradient(const float* probabilities, const int64_t* targets, const float* upstream, int64_t rows,
                    int64_t columns, int64_t first, float* grad, CUstream_st* stream) {
  if (rows == 0 || columns == 0) return;
  gradient_kernel<<<::lockstep::cuda::grid_for(rows * columns, kThreads), kThreads, 0, stream>>>(
      probabilities, targets, upstream, rows, columns, first, grad);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::parallel::cuda
