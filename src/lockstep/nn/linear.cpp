#include "lockstep/nn/linear.h"

#include <cmath>

#include "lockstep/nn/init.h"
#include "lockstep/ops/linalg.h"

namespace lockstep::nn {

Linear::Linear(int64_t in, int64_t out, bool with_bias) : Module("Linear"), in_features(in), out_features(out) {
  LOCKSTEP_CHECK(in > 0 && out > 0) << "Linear(" << in << ", " << out << "): feature counts must be positive";
  weight = register_parameter("weight", Tensor::zeros({out, in}));
  if (with_bias) bias = register_parameter("bias", Tensor::zeros({out}));
  initialize(*this, 0);
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

void Linear::reset_parameter(const std::string& name, const Tensor& parameter, Philox& rng) {
  if (name == "weight") {
    init::kaiming_uniform_(parameter, std::sqrt(5.0), rng);
  } else {
    init::bias_uniform_(parameter, in_features, rng);
  }
}

}  // namespace lockstep::nn
