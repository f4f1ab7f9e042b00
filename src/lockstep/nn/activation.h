// Pointwise activations as layers (torch.nn.ReLU, GELU), for Sequential models.
#pragma once

#include "lockstep/nn/module.h"

namespace lockstep::nn {

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

// The exact form x · Φ(x), PyTorch's default (approximate='none').
class GELU : public Module {
 public:
  GELU() : Module("GELU") {}
  Tensor forward(const Tensor& x) override;
};

}  // namespace lockstep::nn
