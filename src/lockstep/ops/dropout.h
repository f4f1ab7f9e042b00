// Dropout whose mask depends only on (seed, stream, global sample index), never on which
// device or micro-batch holds the sample: the same sample gets the same mask on 1 or 8
// devices.
#pragma once

#include <cstdint>

#include "lockstep/core/tensor.h"

namespace lockstep {

struct DropoutKey {
  uint64_t seed = 0;
  uint64_t stream = 0;       // distinct per layer and step (e.g. from dropout_stream())
  int64_t first_sample = 0;  // global index of x's first sample (axis 0)
};

// Stream id for the dropout layer `layer` at training step `step`.
uint64_t dropout_stream(uint64_t layer, uint64_t step);

// Zeroes each element with probability p and scales the rest by 1/(1-p) when training;
// identity otherwise. Axis 0 of x is the sample axis.
Tensor dropout(const Tensor& x, double p, bool training, const DropoutKey& key);

}  // namespace lockstep
