// Reductions over axes. Axes may be negative; keepdim keeps reduced axes as size 1; an
// empty axes list reduces nothing (NumPy's axis=()). Sums run in an order fixed by the
// shape, so results never depend on the thread count.
#pragma once

#include <vector>

#include "lockstep/core/tensor.h"

namespace lockstep {

Tensor sum(const Tensor& x);  // all elements, a 0-d tensor
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim = false);
// Largest value along one axis; its gradient goes to the first position holding it.
Tensor max(const Tensor& x, int64_t axis, bool keepdim = false);
// Index (i64) of the first largest value along one axis; not differentiable.
Tensor argmax(const Tensor& x, int64_t axis, bool keepdim = false);

// Sums x down to `shape` over the axes broadcasting expanded (the gradient of a broadcast).
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace lockstep
