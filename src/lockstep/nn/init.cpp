#include "lockstep/nn/init.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/ops/random.h"

namespace lockstep::nn {
namespace {

// Each parameter owns 2^40 Philox blocks (2^41 uniform draws): far more than any tensor.
constexpr int kCounterBitsPerParameter = 40;

}  // namespace

Philox init_rng(uint64_t seed, uint64_t index) {
  LOCKSTEP_CHECK(index < (uint64_t{1} << (64 - kCounterBitsPerParameter)))
      << "init: parameter index " << index << " is beyond the " << (uint64_t{1} << (64 - kCounterBitsPerParameter))
      << " parameters the init stream can key";
  return Philox(seed, static_cast<uint64_t>(RngStream::init), index << kCounterBitsPerParameter);
}

void initialize(Module& module, uint64_t seed) {
  NoGradGuard no_grad;
  // Walk modules in named_parameters() order, skipping tensors already seen (tied weights),
  // so parameter numbers match that list exactly.
  std::vector<const TensorImpl*> seen;
  uint64_t index = 0;
  for (const auto& entry : module.named_modules()) {
    Module& owner = *entry.second;
    for (const auto& [name, parameter] : owner.own_parameters()) {
      if (std::find(seen.begin(), seen.end(), parameter.impl()) != seen.end()) continue;
      seen.push_back(parameter.impl());
      Philox rng = init_rng(seed, index++);
      owner.reset_parameter(name, parameter, rng);
    }
  }
}

namespace init {

void uniform_(const Tensor& t, double low, double high, Philox& rng) {
  NoGradGuard no_grad;
  if (low == high) {
    t.fill(low);  // an empty interval (a bias with no inputs): nothing to draw
  } else {
    lockstep::uniform_(t, low, high, rng);
  }
}

void normal_(const Tensor& t, double mean, double stddev, Philox& rng) {
  NoGradGuard no_grad;
  lockstep::normal_(t, mean, stddev, rng);
}

void constant_(const Tensor& t, double value) {
  NoGradGuard no_grad;
  t.fill(value);
}

int64_t fan_in(const Tensor& weight) {
  LOCKSTEP_CHECK(weight.dim() >= 2) << "init::fan_in: needs a weight of 2 or more dims, got "
                                    << shape_str(weight.shape());
  int64_t fan = weight.size(1);
  for (int64_t d = 2; d < weight.dim(); ++d) fan *= weight.size(d);
  return fan;
}

void kaiming_uniform_(const Tensor& weight, double a, Philox& rng) {
  const int64_t fan = fan_in(weight);
  LOCKSTEP_CHECK(fan > 0) << "init::kaiming_uniform_: weight " << shape_str(weight.shape()) << " has no inputs";
  // PyTorch's arithmetic, step by step, so the bound rounds the same.
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double stddev = gain / std::sqrt(static_cast<double>(fan));
  const double bound = std::sqrt(3.0) * stddev;
  init::uniform_(weight, -bound, bound, rng);
}

void bias_uniform_(const Tensor& bias, int64_t fan_in, Philox& rng) {
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  init::uniform_(bias, -bound, bound, rng);
}

}  // namespace init
}  // namespace lockstep::nn
