#include "lockstep/nn/dropout.h"

#include "lockstep/ops/dropout.h"

namespace lockstep::nn {

Dropout::Dropout(double p_) : Module("Dropout"), p(p_) {
  LOCKSTEP_CHECK(p_ >= 0.0 && p_ < 1.0) << "Dropout(p = " << p_ << "): p is the probability of zeroing an element "
                                        << "and must be in [0, 1)";
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p == 0.0) return x;
  LOCKSTEP_CHECK(has_forward_context())
      << "Dropout in training mode needs to know which batch it runs on: call "
         "model.set_forward_context({seed, step, first_sample}) on the model before each forward, or model.eval() "
         "to disable dropout";
  const ForwardContext& context = forward_context();
  DropoutKey key;
  key.seed = context.seed;
  key.stream = dropout_stream(static_cast<uint64_t>(random_layer_index()), context.step);
  key.first_sample = context.first_sample;
  return dropout(x, p, true, key);
}

}  // namespace lockstep::nn
