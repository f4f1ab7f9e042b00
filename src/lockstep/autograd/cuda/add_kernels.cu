#include "lockstep/autograd/cuda/add_kernels.h"
#include "lockstep/core/cuda/check.h"

namespace lockstep::autograd::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void add_kernel(const T* left, const T* right, T* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = left[i] + right[i];
}

}  // namespace

template <typename T>
void add_elements(const T* left, const T* right, T* out, int64_t n, CUstream_st* stream) {
  if (n == 0) return;
  add_kernel<T><<<lockstep::cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(left, right, out, n);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template void add_elements<float>(const float*, const float*, float*, int64_t, CUstream_st*);
template void add_elements<double>(const double*, const double*, double*, int64_t, CUstream_st*);

}  // namespace lockstep::autograd::cuda
