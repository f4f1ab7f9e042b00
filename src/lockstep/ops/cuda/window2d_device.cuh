// What the sliding-window kernels (conv_kernels.cu, pool_kernels.cu) share: the window in
// the kernel's index type, the grid-stride loop in that type, and the choice of the type.
// Kernels index in 32 bits where every index fits (integer division is several times
// cheaper), else in 64 bits. For .cu files only (C++17).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "lockstep/core/cuda/check.h"
#include "lockstep/ops/cpu/window2d.h"

namespace lockstep::ops::cuda {

// Window2d's numbers in the index type I.
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
// step past the end (at most grid_for's 65535·8 blocks of 256 threads).
inline bool fits_int32(int64_t largest) { return largest <= INT_MAX / 2; }

// A grid-stride loop's first index and step, in the kernel's index type.
template <typename I>
__device__ I first_index() {
  return static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
}
template <typename I>
__device__ I grid_stride() {
  return static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
}

// Calls launch(I{}) with the narrowest index type I that holds every index up to largest
// (the largest element count or offset the kernel forms), then checks the launch.
template <typename Launch>
void launch_with_index_type(int64_t largest, const Launch& launch) {
  if (fits_int32(largest)) {
    launch(int32_t{});
  } else {
    launch(int64_t{});
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::ops::cuda
