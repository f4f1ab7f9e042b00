#include "lockstep/nn/flatten.h"

#include "lockstep/ops/shape_ops.h"

namespace lockstep::nn {

Tensor Flatten::forward(const Tensor& x) { return flatten(x, start_axis, end_axis); }

}  // namespace lockstep::nn
