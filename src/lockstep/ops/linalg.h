// Matrix products through BLAS (OpenBLAS on CPU).
#pragma once

#include "lockstep/core/tensor.h"

namespace lockstep {

// [m, k] @ [k, n]; [b, m, k] @ [b, k, n]; [b, m, k] @ [k, n]. Any strides (transposed views
// are passed to BLAS without a copy).
Tensor matmul(const Tensor& a, const Tensor& b);

// x [..., in] · weightᵀ + bias, with weight [out, in] (PyTorch's layout); bias optional.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace lockstep
