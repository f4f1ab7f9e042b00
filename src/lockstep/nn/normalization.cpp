#include "lockstep/nn/normalization.h"

#include "lockstep/nn/init.h"
#include "lockstep/ops/norm.h"

namespace lockstep::nn {

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine)
    : Module("LayerNorm"), normalized_shape(std::move(shape)), eps(eps_) {
  LOCKSTEP_CHECK(!normalized_shape.empty() && lockstep::numel(normalized_shape) > 0)
      << "LayerNorm(" << shape_str(normalized_shape) << "): normalized_shape needs at least one axis, all positive";
  LOCKSTEP_CHECK(eps_ > 0) << "LayerNorm: eps must be positive, got " << eps_;
  if (affine) {
    weight = register_parameter("weight", Tensor::ones(normalized_shape));
    bias = register_parameter("bias", Tensor::zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, normalized_shape, weight, bias, eps); }

void LayerNorm::reset_parameter(const std::string& name, const Tensor& parameter, Philox&) {
  init::constant_(parameter, name == "weight" ? 1.0 : 0.0);
}

}  // namespace lockstep::nn
