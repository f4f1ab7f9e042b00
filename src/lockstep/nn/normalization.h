// Layer normalization as a layer (torch.nn.LayerNorm): normalizes over the trailing
// normalized_shape axes, then scales by weight (ones) and shifts by bias (zeros).
#pragma once

#include "lockstep/nn/module.h"

namespace lockstep::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  explicit LayerNorm(int64_t features, double eps = 1e-5, bool elementwise_affine = true)
      : LayerNorm(Shape{features}, eps, elementwise_affine) {}
  Tensor forward(const Tensor& x) override;
  void reset_parameter(const std::string& name, const Tensor& parameter, Philox& rng) override;

  const Shape normalized_shape;
  const double eps;
  Tensor weight;  // normalized_shape; undefined without elementwise_affine
  Tensor bias;
};

}  // namespace lockstep::nn
