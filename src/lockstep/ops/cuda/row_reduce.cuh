// Fixed-order row reductions for .cu files (C++17). Row kernels (softmax_kernels.cu,
// norm_kernels.cu) give each row one warp, or one whole block of kRowBlock threads for long
// rows. A row's total is a butterfly over the warp's lanes, then (for a block) the warps'
// totals folded in warp order: every thread of the group gets the same total, combined in the
// same order on every call and every run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "lockstep/core/cuda/check.h"

namespace lockstep::ops::cuda {

constexpr int kWarp = 32;
constexpr int kRowBlock = 256;
constexpr int kWarpsPerRowBlock = kRowBlock / kWarp;
// Rows up to this long get one warp each (at most 32 elements a lane); longer rows a block.
constexpr int64_t kWarpRowLimit = 1024;

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// fmax ignores a NaN operand and is symmetric, so every lane of a butterfly ends with the
// same maximum; a NaN element still makes a softmax row NaN through the exp sum.
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

// Every thread of the block (kRowBlock threads) calls this; each gets the same total: the
// warps' totals folded in warp order. scratch holds kWarpsPerRowBlock values.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T* scratch) {
  v = warp_reduce(v, op);
  __syncthreads();  // the previous call's readers are done with scratch
  if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = v;
  __syncthreads();
  T total = scratch[0];
  for (int w = 1; w < kWarpsPerRowBlock; ++w) total = op(total, scratch[w]);
  return total;
}

// The total over the kGroup threads that share a row: a warp, or the whole block.
template <int kGroup, typename T, typename Op>
__device__ T group_reduce(T v, Op op, T* scratch) {
  if constexpr (kGroup == kWarp) {
    (void)scratch;
    return warp_reduce(v, op);
  } else {
    static_assert(kGroup == kRowBlock, "a row belongs to a warp or to the whole block");
    return block_reduce(v, op, scratch);
  }
}

// Calls body(row, lane) for every row of [0, rows) that this thread's group of kGroup
// threads owns (rows strided over the grid), lane being the thread's place in the group.
// The loop bound is the same for every thread of a group, so the group reductions in body
// are reached by all of its threads.
template <int kGroup, typename Body>
__device__ void for_each_row(int64_t rows, const Body& body) {
  constexpr int kRowsPerBlock = kRowBlock / kGroup;
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kGroup; row < rows; row += step) {
    body(row, lane);
  }
}

// Blocks for `rows` rows of `group` threads each (grid-stride beyond the cap).
inline unsigned row_blocks(int64_t rows, int group) { return ::lockstep::cuda::grid_for(rows * group, kRowBlock); }

// Calls launch(std::integral_constant<int, kGroup>{}) with kGroup = kWarp for rows of up to
// kWarpRowLimit elements and kRowBlock for longer ones, then checks the launch.
template <typename Launch>
void launch_by_row_length(int64_t length, const Launch& launch) {
  if (length <= kWarpRowLimit) {
    launch(std::integral_constant<int, kWarp>{});
  } else {
    launch(std::integral_constant<int, kRowBlock>{});
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::ops::cuda
