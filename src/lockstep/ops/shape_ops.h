// Reshaping, views and joins. Views (reshape of contiguous data, transpose, permute,
// slice) share storage; gradients flow through all of them.
#pragma once

#include <vector>

#include "lockstep/core/tensor.h"

namespace lockstep {

// One axis may be -1 (inferred). A view when x is contiguous, else a copy.
Tensor reshape(const Tensor& x, const Shape& shape);
// Merges axes start..end (inclusive) into one.
Tensor flatten(const Tensor& x, int64_t start_axis = 1, int64_t end_axis = -1);
Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& axes);
// Elements start, start+step, ... < end along axis (negative start/end count from the end;
// clamped like Python slices). A view: slicing a batch never copies.
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
Tensor concat(const std::vector<Tensor>& tensors, int64_t axis = 0);
Tensor unsqueeze(const Tensor& x, int64_t axis);
Tensor squeeze(const Tensor& x, int64_t axis);

}  // namespace lockstep
