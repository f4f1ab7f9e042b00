// AdamW, exactly torch.optim.AdamW (its single-tensor path, PyTorch's CPU default):
// decoupled weight decay p *= 1 - lr·wd first, moments by lerp and addcmul, bias-corrected
// step size, and eps added after the square root of the bias-corrected second moment. Same
// operation order, in the parameter's dtype, so results match PyTorch to rounding.
#pragma once

#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW : public Optimizer {
 public:
  // State per parameter: "step" (its own count: a parameter skipped for lack of gradient
  // does not advance it), "exp_avg", "exp_avg_sq".
  AdamW(std::vector<Tensor> params, const AdamWOptions& options);
  const AdamWOptions& options() const { return options_; }

 protected:
  void update(size_t index, const Tensor& param, const Tensor& grad) override;
  const char* name() const override { return "AdamW"; }

 private:
  AdamWOptions options_;
};

}  // namespace lockstep::optim
