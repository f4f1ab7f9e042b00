// Layer normalization over the trailing axes.
#pragma once

#include "lockstep/core/tensor.h"

namespace lockstep {

// Normalizes over the last normalized_shape.size() axes; weight and bias (of
// normalized_shape) optional. Biased variance, as torch.nn.functional.layer_norm.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace lockstep
