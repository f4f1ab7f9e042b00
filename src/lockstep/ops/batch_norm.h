// Batch normalization over the channel axis (axis 1) of x [N, C] or [N, C, *], as
// torch.nn.functional.batch_norm, except that it never updates running statistics: in
// training it returns the batch's statistics, and the caller folds them (nn::BatchNorm does,
// at once or, under a parallel layout, once per step).
#pragma once

#include "lockstep/core/tensor.h"

namespace lockstep {

struct BatchNormResult {
  Tensor output;  // x's shape and dtype
  // Training only (undefined in eval): f64 [C] on x's device, each channel's mean over its
  // n = N · (product of the axes after 1) values, and their unbiased variance (Σ(x - mean)² / (n - 1),
  // what PyTorch folds into running_var; the output is normalized with the biased one, / n).
  Tensor mean;
  Tensor unbiased_var;
};

// training: each channel is normalized with the mean and biased variance of its own n values
// (n > 1 is required, as in PyTorch); running_mean and running_var are not read and may be
// undefined. Not training: with running_mean and running_var ([C], f32 or f64), which must be
// defined. Then y = (x - mean) / sqrt(var + eps) · weight + bias, weight and bias [C] of x's dtype,
// optional. x, weight and bias get gradients (the batch statistics' own dependence on x
// included in training); the running statistics get none. Statistics and the output are
// computed in f64 per channel, each channel's sums in an order fixed by the shape, so results
// do not depend on the thread count; on CPU and CUDA devices (a GPU's sums are fixed trees of
// their own: its results match the CPU's to rounding, and are the same bits every run).
BatchNormResult batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                           const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), bool training = false,
                           double eps = 1e-5);

}  // namespace lockstep
