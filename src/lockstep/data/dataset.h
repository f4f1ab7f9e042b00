// A dataset held in memory: inputs and targets with one sample per row along axis 0. The
// DataLoader batches any Dataset; loaders such as load_fashion_mnist produce one.
#pragma once

#include "lockstep/core/tensor.h"

namespace lockstep {

struct Dataset {
  Tensor images;  // inputs, [N, ...] (f32 [N, 1, 28, 28] for Fashion-MNIST)
  Tensor labels;  // targets, [N, ...] (i64 [N] for Fashion-MNIST)
  int64_t size() const { return images.defined() ? images.size(0) : 0; }
};

}  // namespace lockstep
