// Checked CUDA calls and launch sizes, for the backend's .cu and .cpp files alike (C++17:
// nvcc compiles the .cu files as C++17). Includes cuda_runtime.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

// Throws Error naming the call and CUDA's reason.
#define LOCKSTEP_CUDA_CHECK(call) ::lockstep::cuda::check((call), #call)

namespace lockstep::cuda {

void check(cudaError_t rc, const char* call);

// Blocks per grid for n elements at threads per block, capped so that a grid-stride loop
// covers the rest.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

}  // namespace lockstep::cuda
