// Embedding lookup: rows of a table picked by integer indices.
#pragma once

#include "lockstep/core/tensor.h"

namespace lockstep {

// weight [V, D], indices of any shape (i64 or i32) -> [..., D]. An index outside [0, V) is
// an Error naming it and V. Gradient flows to weight only.
Tensor embedding(const Tensor& indices, const Tensor& weight);

}  // namespace lockstep
