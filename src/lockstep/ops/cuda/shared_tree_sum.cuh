// A block's sum in a fixed order, for kernels where one block makes one output
// (conv_kernels.cu's channel sums, optim/cuda/norm_kernels.cu's sums of squares). For .cu
// files only (C++17).
#pragma once

#include <cuda_runtime.h>

namespace lockstep::ops::cuda {

// The sum of shared[0, kThreads) (one value a thread, already written) folded as a fixed
// binary tree into shared[0]. Every thread of a block of exactly kThreads threads calls it.
template <int kThreads, typename T>
__device__ void shared_tree_sum(T* shared) {
  static_assert(kThreads > 0 && (kThreads & (kThreads - 1)) == 0, "the tree halves the block: a power of two");
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
}

}  // namespace lockstep::ops::cuda
