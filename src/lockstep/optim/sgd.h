// Stochastic gradient descent with momentum, exactly torch.optim.SGD: weight decay added
// to the gradient, the momentum buffer started as the first gradient, then
// buf = momentum·buf + (1 - dampening)·g; Nesterov uses g + momentum·buf; p -= lr·g.
#pragma once

#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening 0
};

class SGD : public Optimizer {
 public:
  // e.g. SGD(model.parameters(), {.lr = 0.1, .momentum = 0.9}). options.lr is the starting
  // lr; set_lr changes it.
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  const SGDOptions& options() const { return options_; }

 protected:
  void update(size_t index, const Tensor& param, const Tensor& grad) override;
  const char* name() const override { return "SGD"; }

 private:
  SGDOptions options_;
};

}  // namespace lockstep::optim
