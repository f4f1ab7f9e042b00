#include "lockstep/nn/activation.h"

#include "lockstep/ops/elementwise.h"

namespace lockstep::nn {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

Tensor GELU::forward(const Tensor& x) { return gelu(x); }

}  // namespace lockstep::nn
