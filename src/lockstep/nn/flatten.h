// Flatten as a layer (torch.nn.Flatten): merges axes start..end, by default every axis but
// the batch axis, so [N, C, H, W] becomes [N, C·H·W].
#pragma once

#include "lockstep/nn/module.h"

namespace lockstep::nn {

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_axis = 1, int64_t end_axis = -1)
      : Module("Flatten"), start_axis(start_axis), end_axis(end_axis) {}
  Tensor forward(const Tensor& x) override;

  const int64_t start_axis, end_axis;
};

}  // namespace lockstep::nn
