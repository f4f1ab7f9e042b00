// Dropout as a layer (torch.nn.Dropout) whose masks do not depend on the device count: in
// training it keys its draws by the ForwardContext the training loop sets on the model
// (seed, step, global index of the batch's first sample) and by its own position among the
// tree's random layers. Identity in eval mode.
#pragma once

#include "lockstep/nn/module.h"

namespace lockstep::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  // Training needs set_forward_context on the model first; forgetting it is an Error rather
  // than the same mask every step.
  Tensor forward(const Tensor& x) override;
  bool uses_randomness() const override { return true; }

  const double p;
};

}  // namespace lockstep::nn
