// Linear (fully connected) layer, as torch.nn.Linear: y = x · weightᵀ + bias with weight
// [out, in], initialized U(-1/sqrt(in), 1/sqrt(in)) for both weight and bias.
#pragma once

#include "lockstep/nn/module.h"

namespace lockstep::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  void reset_parameter(const std::string& name, const Tensor& parameter, Philox& rng) override;

  const int64_t in_features, out_features;
  Tensor weight;  // [out, in]
  Tensor bias;    // [out], undefined without bias
};

}  // namespace lockstep::nn
