// Parameter initialization as PyTorch's defaults, drawn from counter-based Philox streams so
// the weights are a function of the seed alone: parameter number i (in named_parameters()
// order) draws from (seed, RngStream::init, counters [i * 2^40, (i + 1) * 2^40)), whatever
// the device count or the order modules are built in.
#pragma once

#include <cstdint>

#include "lockstep/core/philox.h"
#include "lockstep/core/tensor.h"
#include "lockstep/nn/module.h"

namespace lockstep::nn {

// (Re)initializes every parameter of the tree in named_parameters() order, each by its
// module's reset_parameter, without autograd. Layers come out of their constructors as
// initialize(layer, 0) leaves them (usable alone); a model built of several layers must be
// initialized as a whole (make_model does it), else layers of equal shape start equal.
void initialize(Module& module, uint64_t seed);

// The generator for parameter number `index` under `seed`.
Philox init_rng(uint64_t seed, uint64_t index);

namespace init {

// In place, in element order, f32 or f64, no autograd (lockstep::uniform_ / normal_ of
// ops/random.h: one double drawn per element, rounded to the tensor's dtype).
void uniform_(const Tensor& t, double low, double high, Philox& rng);
void normal_(const Tensor& t, double mean, double stddev, Philox& rng);
void constant_(const Tensor& t, double value);

// Inputs per output unit: size(1) times the kernel's elements (dims 2...). Needs dim >= 2.
int64_t fan_in(const Tensor& weight);
// torch.nn.init.kaiming_uniform_(w, a) with mode fan_in and leaky_relu gain: U(-b, b) with
// b = sqrt(3) * sqrt(2 / (1 + a^2)) / sqrt(fan_in). a = sqrt(5) (Linear's and Conv2d's
// default) gives b = 1 / sqrt(fan_in).
void kaiming_uniform_(const Tensor& weight, double a, Philox& rng);
// PyTorch's default bias of Linear/Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), 0 bound when
// fan_in is 0.
void bias_uniform_(const Tensor& bias, int64_t fan_in, Philox& rng);

}  // namespace init
}  // namespace lockstep::nn
