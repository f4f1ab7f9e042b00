// Filling tensors from the counter-based generator (initialization).
#pragma once

#include "lockstep/core/philox.h"
#include "lockstep/core/tensor.h"

namespace lockstep {

// In place, in element order, advancing rng; f32 or f64.
void uniform_(const Tensor& t, double low, double high, Philox& rng);
void normal_(const Tensor& t, double mean, double stddev, Philox& rng);

}  // namespace lockstep
