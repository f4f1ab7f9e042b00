// Softmax family and the classification loss.
#pragma once

#include "lockstep/core/tensor.h"

namespace lockstep {

Tensor softmax(const Tensor& x, int64_t axis = -1);
Tensor log_softmax(const Tensor& x, int64_t axis = -1);

enum class Reduction { mean, sum, none };

// logits [N, C], labels [N] of class indices (i64 or i32, each in [0, C)); like
// torch.nn.functional.cross_entropy. A label out of range is an Error naming it.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction = Reduction::mean);

}  // namespace lockstep
