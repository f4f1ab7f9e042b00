// Convolution and pooling over NCHW images; weights [out, in, kh, kw] as in PyTorch.
#pragma once

#include <array>

#include "lockstep/core/tensor.h"

namespace lockstep {

using Pair = std::array<int64_t, 2>;  // (height, width)

// x [N, C, H, W], weight [O, C, KH, KW], bias [O] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Pair stride = {1, 1},
              Pair padding = {0, 0});
// stride {0, 0} means stride = kernel. Padding counts as -inf for max pooling.
Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0});
// Average including zero padding in the divisor (PyTorch's count_include_pad=True).
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0});

}  // namespace lockstep
