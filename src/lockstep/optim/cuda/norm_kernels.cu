#include <algorithm>

#include "lockstep/core/cuda/check.h"
#include "lockstep/ops/cuda/shared_tree_sum.cuh"
#include "lockstep/optim/cuda/norm_kernels.h"

namespace lockstep::optim::cuda {
namespace {

constexpr int kThreads = 256;  // a power of two: the shared-memory tree halves it
// Enough blocks to fill an H100/H200 several times over; past this each thread sums more.
constexpr int64_t kMaxBlocks = 1024;

int64_t blocks_for(int64_t n) { return std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks); }

// partials[block] = the squares of the block's elements of a grid-stride walk, each thread
// summing its own elements in index order, then the block's fixed tree.
template <typename T>
__global__ void square_sum_blocks(const T* x, int64_t n, double* partials) {
  __shared__ double shared[kThreads];
  double sum = 0.0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const double value = static_cast<double>(x[i]);
    sum += value * value;
  }
  shared[threadIdx.x] = sum;
  ops::cuda::shared_tree_sum<kThreads>(shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// *out = the sum of count partials: one block, each thread a strided run, then the tree.
__global__ void sum_partials(const double* partials, int64_t count, double* out) {
  __shared__ double shared[kThreads];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) sum += partials[i];
  shared[threadIdx.x] = sum;
  ops::cuda::shared_tree_sum<kThreads>(shared);
  if (threadIdx.x == 0) *out = shared[0];
}

template <typename T>
__global__ void scale_kernel(T* x, int64_t n, T factor) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = x[i] * factor;
}

}  // namespace

int64_t sum_of_squares_scratch(int64_t n) {
  const int64_t blocks = blocks_for(n);
  return blocks == 1 ? 0 : blocks;
}

template <typename T>
void sum_of_squares(const T* x, int64_t n, double* scratch, double* out, CUstream_st* stream) {
  const int64_t blocks = blocks_for(n);
  if (blocks == 1) {  // one block's tree is the whole sum (also n == 0: it writes 0)
    square_sum_blocks<T><<<1, kThreads, 0, stream>>>(x, n, out);
    LOCKSTEP_CUDA_CHECK(cudaGetLastError());
    return;
  }
  square_sum_blocks<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, n, scratch);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
  sum_partials<<<1, kThreads, 0, stream>>>(scratch, blocks, out);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void scale_elements(T* x, int64_t n, T factor, CUstream_st* stream) {
  if (n == 0) return;
  scale_kernel<T><<<lockstep::cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, factor);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template void sum_of_squares<float>(const float*, int64_t, double*, double*, CUstream_st*);
template void sum_of_squares<double>(const double*, int64_t, double*, double*, CUstream_st*);
template void scale_elements<float>(float*, int64_t, float, CUstream_st*);
template void scale_elements<double>(double*, int64_t, double, CUstream_st*);

}  // namespace lockstep::optim::cuda
