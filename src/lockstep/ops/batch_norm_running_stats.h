// BatchNorm's running statistics folded with the batch statistics of a step (nn::BatchNorm's
// apply_step_statistics, once per forward outside a layout and once per step under one), on
// the buffers' own device: on a GPU one kernel reads the count and updates all three buffers
// there, so the host never waits for the step whose statistics it folds.
#pragma once

#include <optional>

#include "lockstep/core/tensor.h"

namespace lockstep {

// mean_sum and var_sum [C] add up the batch means and unbiased variances of `forwards`
// training forwards ([1]; any float dtype and device, all three). When that count is positive,
//   running = (1 - f) · running + f · (sum / forwards)
// per element in f64, rounded once to the running statistics' dtype (f32 or f64, [C],
// contiguous, on one device), with f = momentum, or 1 / (num_batches_tracked + 1) without one
// (PyTorch's momentum=None, the cumulative average); and num_batches_tracked (i64, 0-d) += 1.
// A count of 0 changes nothing. A negative or non-finite count is an error naming `who` where
// the count is in host memory; in GPU memory only the kernel reads it (the host would wait for
// the step), and such a count changes nothing.
void fold_batch_norm_running_stats(const Tensor& running_mean, const Tensor& running_var,
                                   const Tensor& num_batches_tracked, const Tensor& mean_sum, const Tensor& var_sum,
                                   const Tensor& forwards, std::optional<double> momentum, const char* who);

}  // namespace lockstep
