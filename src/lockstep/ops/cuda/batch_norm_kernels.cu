#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "lockstep/core/cuda/check.h"
#include "lockstep/core/error.h"
#include "lockstep/ops/cuda/batch_norm_kernels.h"
#include "lockstep/ops/cuda/shared_tree_sum.cuh"
#include "lockstep/ops/cuda/window2d_device.cuh"

namespace lockstep::ops::cuda {
namespace {

// Threads of a channel's block. A few channels of many values are the common case (a ResNet's
// first stage: 16 channels of N·784 values), so a block brings many loads in flight.
constexpr int kChannelThreads = 512;
// Threads per block of the elementwise kernels.
constexpr int kThreads = 256;

// Calls f(offset) for this thread's values of channel c of x [batch, channels, spatial]: the
// channel's value j = i·spatial + s (in (i, s) order) for j = threadIdx.x, threadIdx.x +
// kChannelThreads, ..., its offset (i·channels + c)·spatial + s stepped without dividing.
template <typename F>
__device__ void for_channel_values(int64_t batch, int64_t channels, int64_t spatial, int64_t c, const F& f) {
  const int64_t n = batch * spatial;
  if (static_cast<int64_t>(threadIdx.x) >= n) return;  // also when spatial is 0: nothing to divide by
  const int64_t step_i = kChannelThreads / spatial, step_s = kChannelThreads % spatial;
  int64_t i = threadIdx.x / spatial, s = threadIdx.x % spatial;
  for (int64_t j = threadIdx.x; j < n; j += kChannelThreads) {
    f((i * channels + c) * spatial + s);
    i += step_i;
    s += step_s;
    if (s >= spatial) {  // s and step_s are below spatial: one carry at most
      s -= spatial;
      ++i;
    }
  }
}

// Block c: the mean, then the sum of squared deviations from it (two passes, as the CPU, so the
// variance does not lose digits to a large mean).
template <typename T>
__global__ void __launch_bounds__(kChannelThreads)
    batch_norm_statistics_kernel(const T* x, int64_t batch, int64_t channels, int64_t spatial, double eps, double* mean,
                                 double* rstd, double* batch_mean, double* unbiased_var) {
  // Two arrays: the second pass writes its partials while other threads may still read the
  // first tree's total.
  __shared__ double sums[kChannelThreads];
  __shared__ double squares[kChannelThreads];
  const int64_t c = blockIdx.x;
  const auto n = static_cast<double>(batch * spatial);
  double s = 0;
  for_channel_values(batch, channels, spatial, c, [&](int64_t k) { s += static_cast<double>(x[k]); });
  sums[threadIdx.x] = s;
  shared_tree_sum<kChannelThreads>(sums);
  const double m = sums[0] / n;
  double q = 0;
  for_channel_values(batch, channels, spatial, c, [&](int64_t k) { q += (x[k] - m) * (x[k] - m); });
  squares[threadIdx.x] = q;
  shared_tree_sum<kChannelThreads>(squares);
  if (threadIdx.x == 0) {
    const double total = squares[0];
    mean[c] = m;
    rstd[c] = 1.0 / sqrt(total / n + eps);
    batch_mean[c] = m;
    unbiased_var[c] = total / (n - 1);
  }
}

__global__ void batch_norm_running_rstd_kernel(const double* running_mean, const double* running_var, int64_t channels,
                                               double eps, double* mean, double* rstd) {
  for (int64_t c = first_index<int64_t>(); c < channels; c += grid_stride<int64_t>()) {
    mean[c] = running_mean[c];
    rstd[c] = 1.0 / sqrt(running_var[c] + eps);
  }
}

template <typename T, typename I>
__global__ void batch_norm_normalize_kernel(const T* x, const T* w, const T* b, const double* mean, const double* rstd,
                                            T* y, I channels, I spatial, I total) {
  for (I j = first_index<I>(); j < total; j += grid_stride<I>()) {
    const I c = (j / spatial) % channels;
    const double scale = w != nullptr ? rstd[c] * w[c] : rstd[c];
    const double shift = b != nullptr ? static_cast<double>(b[c]) : 0.0;
    y[j] = static_cast<T>((x[j] - mean[c]) * scale + shift);
  }
}

// Block c: Σ dy and Σ dy · x̂ over the channel, folded as two fixed trees.
template <typename T>
__global__ void __launch_bounds__(kChannelThreads)
    batch_norm_backward_sums_kernel(const T* x, const T* dy, const double* mean, const double* rstd, int64_t batch,
                                    int64_t channels, int64_t spatial, double* sums, T* dw, T* db) {
  __shared__ double dy_sums[kChannelThreads];
  __shared__ double dy_xhat_sums[kChannelThreads];
  const int64_t c = blockIdx.x;
  const double m = mean[c], s = rstd[c];
  double sum_dy = 0, sum_dy_xhat = 0;
  for_channel_values(batch, channels, spatial, c, [&](int64_t k) {
    sum_dy += static_cast<double>(dy[k]);
    sum_dy_xhat += dy[k] * ((x[k] - m) * s);
  });
  dy_sums[threadIdx.x] = sum_dy;
  dy_xhat_sums[threadIdx.x] = sum_dy_xhat;
  shared_tree_sum<kChannelThreads>(dy_sums);
  shared_tree_sum<kChannelThreads>(dy_xhat_sums);
  if (threadIdx.x == 0) {
    sums[c] = dy_sums[0];
    sums[channels + c] = dy_xhat_sums[0];
    if (dw != nullptr) dw[c] = static_cast<T>(dy_xhat_sums[0]);
    if (db != nullptr) db[c] = static_cast<T>(dy_sums[0]);
  }
}

template <typename T, typename I>
__global__ void batch_norm_backward_input_kernel(const T* x, const T* w, const T* dy, const double* mean,
                                                 const double* rstd, const double* sums, T* dx, I channels, I spatial,
                                                 I total, double n) {
  for (I j = first_index<I>(); j < total; j += grid_stride<I>()) {
    const I c = (j / spatial) % channels;
    const double m = mean[c], s = rstd[c];
    const double scale = w != nullptr ? s * w[c] : s;
    const double a = sums != nullptr ? sums[c] / n : 0.0;
    const double k = sums != nullptr ? sums[channels + c] / n : 0.0;
    dx[j] = static_cast<T>(scale * (dy[j] - a - (x[j] - m) * s * k));
  }
}

// One block: every thread reads the count before thread 0 replaces it.
template <typename T>
__global__ void batch_norm_fold_running_stats_kernel(T* running_mean, T* running_var, int64_t* num_batches_tracked,
                                                     const double* mean_sum, const double* var_sum,
                                                     const double* forwards_at, int64_t channels, bool cumulative,
                                                     double momentum) {
  const double forwards = *forwards_at;
  if (!(forwards > 0) || isinf(forwards)) return;  // the same branch for the whole block
  const int64_t tracked = *num_batches_tracked + 1;
  __syncthreads();
  if (threadIdx.x == 0) *num_batches_tracked = tracked;
  const double factor = cumulative ? 1.0 / static_cast<double>(tracked) : momentum;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    running_mean[c] =
        static_cast<T>((1.0 - factor) * static_cast<double>(running_mean[c]) + factor * (mean_sum[c] / forwards));
    running_var[c] =
        static_cast<T>((1.0 - factor) * static_cast<double>(running_var[c]) + factor * (var_sum[c] / forwards));
  }
}

// One block per channel: the grid's x dimension holds up to INT_MAX blocks.
unsigned channel_blocks(int64_t channels, const char* what) {
  LOCKSTEP_CHECK(channels <= INT_MAX) << what << " on a GPU: " << channels
                                      << " channels is more than a grid holds (one block each, at most " << INT_MAX
                                      << ")";
  return static_cast<unsigned>(channels);
}

}  // namespace

template <typename T>
void batch_norm_statistics(const T* x, int64_t batch, int64_t channels, int64_t spatial, double eps, double* mean,
                           double* rstd, double* batch_mean, double* unbiased_var, CUstream_st* stream) {
  if (channels == 0) return;
  batch_norm_statistics_kernel<T><<<channel_blocks(channels, "batch_norm"), kChannelThreads, 0, stream>>>(
      x, batch, channels, spatial, eps, mean, rstd, batch_mean, unbiased_var);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

void batch_norm_running_rstd(const double* running_mean, const double* running_var, int64_t channels, double eps,
                             double* mean, double* rstd, CUstream_st* stream) {
  if (channels == 0) return;
  batch_norm_running_rstd_kernel<<<::lockstep::cuda::grid_for(channels, kThreads), kThreads, 0, stream>>>(
      running_mean, running_var, channels, eps, mean, rstd);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void batch_norm_normalize(const T* x, const T* w, const T* b, const double* mean, const double* rstd, T* y,
                          int64_t batch, int64_t channels, int64_t spatial, CUstream_st* stream) {
  const int64_t total = batch * channels * spatial;
  if (total == 0) return;
  launch_with_index_type(total, [&](auto index) {
    using I = decltype(index);
    batch_norm_normalize_kernel<T, I><<<::lockstep::cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
        x, w, b, mean, rstd, y, static_cast<I>(channels), static_cast<I>(spatial), static_cast<I>(total));
  });
}

template <typename T>
void batch_norm_backward_sums(const T* x, const T* dy, const double* mean, const double* rstd, int64_t batch,
                              int64_t channels, int64_t spatial, double* sums, T* dw, T* db, CUstream_st* stream) {
  if (channels == 0) return;
  batch_norm_backward_sums_kernel<T><<<channel_blocks(channels, "batch_norm backward"), kChannelThreads, 0, stream>>>(
      x, dy, mean, rstd, batch, channels, spatial, sums, dw, db);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void batch_norm_backward_input(const T* x, const T* w, const T* dy, const double* mean, const double* rstd,
                               const double* sums, T* dx, int64_t batch, int64_t channels, int64_t spatial,
                               CUstream_st* stream) {
  const int64_t total = batch * channels * spatial;
  if (total == 0) return;
  const auto n = static_cast<double>(batch * spatial);
  launch_with_index_type(total, [&](auto index) {
    using I = decltype(index);
    batch_norm_backward_input_kernel<T, I><<<::lockstep::cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
        x, w, dy, mean, rstd, sums, dx, static_cast<I>(channels), static_cast<I>(spatial), static_cast<I>(total), n);
  });
}

template <typename T>
void batch_norm_fold_running_stats(T* running_mean, T* running_var, int64_t* num_batches_tracked,
                                   const double* mean_sum, const double* var_sum, const double* forwards,
                                   int64_t channels, bool cumulative, double momentum, CUstream_st* stream) {
  batch_norm_fold_running_stats_kernel<T><<<1, kThreads, 0, stream>>>(
      running_mean, running_var, num_batches_tracked, mean_sum, var_sum, forwards, channels, cumulative, momentum);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

#define LOCKSTEP_INSTANTIATE(T)                                                                                  \
  template void batch_norm_statistics<T>(const T*, int64_t, int64_t, int64_t, double, double*, double*, double*, \
                                         double*, CUstream_st*);                                                 \
  template void batch_norm_normalize<T>(const T*, const T*, const T*, const double*, const double*, T*, int64_t, \
                                        int64_t, int64_t, CUstream_st*);                                         \
  template void batch_norm_backward_sums<T>(const T*, const T*, const double*, const double*, int64_t, int64_t,  \
                                            int64_t, double*, T*, T*, CUstream_st*);                             \
  template void batch_norm_backward_input<T>(const T*, const T*, const T*, const double*, const double*,         \
                                             const double*, T*, int64_t, int64_t, int64_t, CUstream_st*);        \
  template void batch_norm_fold_running_stats<T>(T*, T*, int64_t*, const double*, const double*, const double*,  \
                                                 int64_t, bool, double, CUstream_st*);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::ops::cuda
