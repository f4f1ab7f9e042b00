#include "lockstep/optim/loss_scaler.h"

#include <cmath>
#include <limits>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/ops/ops.h"

namespace lockstep::optim {
namespace {

bool power_of_two(double x) {
  int exponent = 0;
  return x > 0 && std::isfinite(x) && std::frexp(x, &exponent) == 0.5;
}

// The most a scale may grow to: past it a doubled f32 loss could overflow by itself.
constexpr double kMaxScale = 0x1p100;

}  // namespace

LossScaler::LossScaler(LossScalerOptions options) : options_(options), scale_(options.init_scale) {
  LOCKSTEP_CHECK(power_of_two(options.init_scale))
      << "loss scale " << options.init_scale
      << " is not a power of two: unscaling must be exact (use 65536, PyTorch's default, or another 2^k)";
  LOCKSTEP_CHECK(options.growth_interval >= 1)
      << "loss scale growth interval must be at least 1 step, got " << options.growth_interval;
}

bool LossScaler::unscale(const std::vector<Tensor>& gradients) const {
  NoGradGuard no_grad;
  bool finite = true;
  for (const Tensor& g : gradients) {
    if (!g.defined() || g.numel() == 0) continue;
    // x * 0 is 0 for every finite x and NaN for inf and NaN: one sum says whether any is not finite.
    if (!std::isfinite(sum(mul(g, 0.0)).item())) finite = false;
    g.copy_from(mul(g, 1.0 / scale_));  // exact: the scale is a power of two
  }
  return finite;
}

void LossScaler::update(bool finite) {
  if (!finite) {
    scale_ = std::max(scale_ * 0.5, std::numeric_limits<double>::min());
    streak_ = 0;
    return;
  }
  if (++streak_ >= options_.growth_interval) {
    scale_ = std::min(scale_ * 2.0, kMaxScale);
    streak_ = 0;
  }
}

NamedTensors LossScaler::state_dict() const {
  return {{"loss_scale", Tensor::scalar(scale_, DType::f64)},
          {"loss_scale_streak", Tensor::scalar(static_cast<double>(streak_), DType::i64)}};
}

void LossScaler::load_state_dict(const NamedTensors& state) {
  bool have_scale = false;
  for (const auto& [name, tensor] : state) {
    if (name == "loss_scale") {
      const double value = tensor.item();
      LOCKSTEP_CHECK(power_of_two(value)) << "checkpoint's loss_scale " << value << " is not a power of two";
      scale_ = value;
      have_scale = true;
    } else if (name == "loss_scale_streak") {
      streak_ = static_cast<int64_t>(tensor.item());
    }
  }
  LOCKSTEP_CHECK(have_scale) << "loss scaler state has no \"loss_scale\" entry";
}

NamedTensors extract_scaler_state(NamedTensors& state) {
  NamedTensors scaler, rest;
  for (auto& entry : state) (entry.first.starts_with("loss_scale") ? scaler : rest).push_back(std::move(entry));
  state = std::move(rest);
  return scaler;
}

}  // namespace lockstep::optim
