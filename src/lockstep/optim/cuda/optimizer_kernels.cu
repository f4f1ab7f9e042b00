#include "lockstep/core/cuda/check.h"
#include "lockstep/optim/cuda/optimizer_kernels.h"
#include "lockstep/optim/with_flag.h"

namespace lockstep::optim::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float square_root(float x) { return sqrtf(x); }
__device__ double square_root(double x) { return sqrt(x); }

// sgd.cpp's sgd_loop, one element per thread, grid-stride.
template <typename T, bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
__global__ void sgd_kernel(T* p, const T* g, T* buf, int64_t n, SgdStep<T> s) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    T d = g[i];
    if constexpr (kDecay) d = d + s.weight_decay * p[i];
    if constexpr (kMomentum) {
      T b;
      if constexpr (kFirst) {
        b = d;
      } else {
        b = buf[i] * s.momentum;
        b = b + s.one_minus_dampening * d;
      }
      buf[i] = b;
      if constexpr (kNesterov) {
        d = d + s.momentum * b;
      } else {
        d = b;
      }
    }
    p[i] = p[i] + s.neg_lr * d;
  }
}

// adamw.cpp's adamw_loop, one element per thread, grid-stride.
template <typename T, bool kDecay, bool kLerpSmall>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, int64_t n, AdamWStep<T> s) {
  const T coefficient = kLerpSmall ? s.lerp_weight : s.lerp_weight - T(1);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    T param = p[i];
    if constexpr (kDecay) param = param * s.decay;
    const T grad = g[i];
    const T avg = m[i];
    const T diff = grad - avg;
    const T new_avg = (kLerpSmall ? avg : grad) + coefficient * diff;
    T sq = v[i] * s.beta2;
    sq = sq + s.one_minus_beta2 * grad * grad;
    const T denom = square_root(sq) / s.bias_correction2_sqrt + s.eps;
    p[i] = param + s.neg_step_size * new_avg / denom;
    m[i] = new_avg;
    v[i] = sq;
  }
}

}  // namespace

template <typename T>
void sgd_update(T* param, const T* grad, T* buffer, int64_t n, const SgdStep<T>& step, CUstream_st* stream) {
  if (n == 0) return;
  const unsigned blocks = lockstep::cuda::grid_for(n, kThreads);
  with_flag(step.decay, [&](auto decay) {
    with_flag(step.use_momentum, [&](auto momentum) {
      // first and nesterov only matter with a momentum buffer.
      with_flag(momentum.value && step.first, [&](auto first) {
        with_flag(momentum.value && step.nesterov, [&](auto nesterov) {
          sgd_kernel<T, decltype(decay)::value, decltype(momentum)::value, decltype(first)::value,
                     decltype(nesterov)::value><<<blocks, kThreads, 0, stream>>>(param, grad, buffer, n, step);
        });
      });
    });
  });
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void adamw_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, const AdamWStep<T>& step,
                  CUstream_st* stream) {
  if (n == 0) return;
  const unsigned blocks = lockstep::cuda::grid_for(n, kThreads);
  with_flag(step.use_decay, [&](auto decay) {
    with_flag(step.lerp_small, [&](auto lerp_small) {
      adamw_kernel<T, decltype(decay)::value, decltype(lerp_small)::value>
          <<<blocks, kThreads, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, n, step);
    });
  });
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template void sgd_update<float>(float*, const float*, float*, int64_t, const SgdStep<float>&, CUstream_st*);
template void sgd_update<double>(double*, const double*, double*, int64_t, const SgdStep<double>&, CUstream_st*);
template void adamw_update<float>(float*, const float*, float*, float*, int64_t, const AdamWStep<float>&, CUstream_st*);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t, const AdamWStep<double>&,
                                   CUstream_st*);

}  // namespace lockstep::optim::cuda
