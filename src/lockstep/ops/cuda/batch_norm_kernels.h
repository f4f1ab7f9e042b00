// GPU kernels for batch normalization, the CUDA side of ops/batch_norm.cpp: x is viewed as
// [N, C, S] (S the product of the axes after the channel axis) and channel c holds the n = N·S
// values x[i, c, s]. Statistics and gradient sums are f64 per channel, as on the CPU; each
// channel's sums are one block's, its threads taking the channel's values at a fixed stride and
// folding their partial sums as a fixed tree (no atomics), so results depend on the shape alone.
// Pointers are device pointers; work is queued on stream.
#pragma once

#include <cstdint>

struct CUstream_st;  // = cudaStream_t

namespace lockstep::ops::cuda {

// Training: per channel, the mean and rstd = 1 / sqrt(biased variance + eps) that normalize
// the output and serve backward, and the batch's mean again in batch_mean and its unbiased
// variance (Σ(x - mean)² / (n - 1)) in unbiased_var, all f64 [C]. n > 1.
template <typename T>
void batch_norm_statistics(const T* x, int64_t batch, int64_t channels, int64_t spatial, double eps, double* mean,
                           double* rstd, double* batch_mean, double* unbiased_var, CUstream_st* stream);

// Eval: mean[c] = running_mean[c] and rstd[c] = 1 / sqrt(running_var[c] + eps), f64 [C].
void batch_norm_running_rstd(const double* running_mean, const double* running_var, int64_t channels, double eps,
                             double* mean, double* rstd, CUstream_st* stream);

// y = (x - mean[c]) · (rstd[c] · w[c]) + b[c], in f64 per element; w and b may be null (absent).
template <typename T>
void batch_norm_normalize(const T* x, const T* w, const T* b, const double* mean, const double* rstd, T* y,
                          int64_t batch, int64_t channels, int64_t spatial, CUstream_st* stream);

// Backward's per-channel sums: sums[c] = Σ dy and sums[C + c] = Σ dy · x̂, x̂ = (x - mean) · rstd
// (f64 [2C]), and the same rounded to T in db and dw, which may be null (not needed).
template <typename T>
void batch_norm_backward_sums(const T* x, const T* dy, const double* mean, const double* rstd, int64_t batch,
                              int64_t channels, int64_t spatial, double* sums, T* dw, T* db, CUstream_st* stream);

// dx = rstd · w · (dy - a - x̂ · k) per element, with a = Σ dy / n and k = Σ dy · x̂ / n from
// batch_norm_backward_sums' sums in training, and a = k = 0 (the statistics are constants) when
// sums is null. w may be null (absent).
template <typename T>
void batch_norm_backward_input(const T* x, const T* w, const T* dy, const double* mean, const double* rstd,
                               const double* sums, T* dx, int64_t batch, int64_t channels, int64_t spatial,
                               CUstream_st* stream);

// nn::BatchNorm's update of its running statistics from a step's sums, read on the device so the
// host never waits for the step: when *forwards is a positive finite count,
//   running = (1 - f) · running + f · (sum / forwards)  for the mean and the variance,
// f = momentum, or 1 / (*num_batches_tracked + 1) when cumulative, and *num_batches_tracked += 1;
// anything else leaves all three unchanged. The sums are f64 [C].
template <typename T>
void batch_norm_fold_running_stats(T* running_mean, T* running_var, int64_t* num_batches_tracked,
                                   const double* mean_sum, const double* var_sum, const double* forwards,
                                   int64_t channels, bool cumulative, double momentum, CUstream_st* stream);

}  // namespace lockstep::ops::cuda
