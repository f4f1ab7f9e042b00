#include "lockstep/nn/normalization.h"

#include <cmath>
#include <utility>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/nn/init.h"
#include "lockstep/ops/batch_norm.h"
#include "lockstep/ops/batch_norm_running_stats.h"
#include "lockstep/ops/elementwise.h"
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

namespace lockstep::nn {

BatchNorm::BatchNorm(std::string type_name, int64_t features, double eps_, std::optional<double> momentum_,
                     bool affine_, bool track)
    : Module(std::move(type_name)),
      num_features(features),
      eps(eps_),
      momentum(momentum_),
      affine(affine_),
      track_running_stats(track) {
  LOCKSTEP_CHECK(features > 0) << this->type_name() << "(" << features << "): num_features must be positive";
  LOCKSTEP_CHECK(eps_ > 0 && std::isfinite(eps_))
      << this->type_name() << ": eps must be positive and finite, got " << eps_;
  LOCKSTEP_CHECK(!momentum_ || (*momentum_ >= 0 && *momentum_ <= 1))
      << this->type_name() << ": momentum must be in [0, 1] (or nullopt for a cumulative average), got " << *momentum_;
  if (affine_) {
    weight = register_parameter("weight", Tensor::ones({features}));
    bias = register_parameter("bias", Tensor::zeros({features}));
  }
  if (track) {
    running_mean = register_buffer("running_mean", Tensor::zeros({features}));
    running_var = register_buffer("running_var", Tensor::ones({features}));
    num_batches_tracked = register_buffer("num_batches_tracked", Tensor::zeros({}, DType::i64));
  }
}

void BatchNorm1d::check_rank(const Tensor& x) const {
  LOCKSTEP_CHECK(x.dim() == 2 || x.dim() == 3) << "BatchNorm1d: expected 2D or 3D input ([N, C] or [N, C, L]), got "
                                               << x.dim() << "D input of shape " << shape_str(x.shape());
}

void BatchNorm2d::check_rank(const Tensor& x) const {
  LOCKSTEP_CHECK(x.dim() == 4) << "BatchNorm2d: expected 4D input ([N, C, H, W]), got " << x.dim()
                               << "D input of shape " << shape_str(x.shape());
}

Tensor BatchNorm::forward(const Tensor& x) {
  check_rank(x);
  LOCKSTEP_CHECK(x.size(1) == num_features) << type_name() << "(" << num_features << "): input " << shape_str(x.shape())
                                            << " has " << x.size(1) << " channels on axis 1, expected " << num_features;
  const bool batch_statistics = is_training() || !track_running_stats;
  BatchNormResult result = batch_norm(x, batch_statistics ? Tensor() : running_mean,
                                      batch_statistics ? Tensor() : running_var, weight, bias, batch_statistics, eps);
  if (is_training() && track_running_stats) {
    // Onto the buffers' device too: under DDP ranks that keep one copy of the weights, a rank's
    // activations may lie on another CPU device than its buffers.
    const Tensor mean = result.mean.to(running_mean.dtype()).to(running_mean.device());
    const Tensor var = result.unbiased_var.to(running_var.dtype()).to(running_var.device());
    if (defers_step_statistics()) {
      make_pending();
      // Ops, not loops, so that the sums stay on the module's device (a GPU's included).
      NoGradGuard no_grad;
      pending_mean_ = add(pending_mean_, mean);
      pending_var_ = add(pending_var_, var);
      pending_forwards_ = add(pending_forwards_, 1.0);
    } else {
      apply_step_statistics({mean, var, Tensor::ones({1}, running_mean.dtype(), running_mean.device())});
    }
  }
  return result.output;
}

void BatchNorm::make_pending() {
  const Device device = running_mean.device();
  const DType dtype = running_mean.dtype();
  if (pending_mean_.defined() && pending_mean_.device() == device && pending_mean_.dtype() == dtype) return;
  if (pending_mean_.defined()) {  // the module moved since: its sums go with it
    pending_mean_ = pending_mean_.to(device).to(dtype);
    pending_var_ = pending_var_.to(device).to(dtype);
    pending_forwards_ = pending_forwards_.to(device).to(dtype);
    return;
  }
  pending_mean_ = Tensor::zeros({num_features}, dtype, device);
  pending_var_ = Tensor::zeros({num_features}, dtype, device);
  pending_forwards_ = Tensor::zeros({1}, dtype, device);
}

std::vector<Tensor> BatchNorm::take_step_statistics() {
  if (!track_running_stats) return {};
  make_pending();
  std::vector<Tensor> sums{pending_mean_, pending_var_, pending_forwards_};
  // The caller owns these now (it may fold into them); the next forward starts from fresh zeros.
  pending_mean_ = pending_var_ = pending_forwards_ = Tensor();
  return sums;
}

void BatchNorm::apply_step_statistics(const std::vector<Tensor>& sums) {
  if (!track_running_stats) {
    LOCKSTEP_CHECK(sums.empty()) << type_name() << " without track_running_stats has no running statistics, but got "
                                 << sums.size() << " step statistics";
    return;
  }
  const Shape features{num_features};
  LOCKSTEP_CHECK(sums.size() == 3 && sums[0].defined() && sums[1].defined() && sums[2].defined() &&
                 sums[0].shape() == features && sums[1].shape() == features && sums[2].shape() == Shape{1})
      << type_name() << "(" << num_features << "): step statistics must be {mean_sum " << shape_str(features)
      << ", var_sum " << shape_str(features) << ", forwards [1]}, as take_step_statistics returns them";
  fold_batch_norm_running_stats(running_mean, running_var, num_batches_tracked, sums[0], sums[1], sums[2], momentum,
                                type_name().c_str());
}

void BatchNorm::reset_running_stats() {
  pending_mean_ = pending_var_ = pending_forwards_ = Tensor();
  if (!track_running_stats) return;
  running_mean.zero();
  running_var.fill(1.0);
  num_batches_tracked.zero();
}

void BatchNorm::reset_parameter(const std::string& name, const Tensor& parameter, Philox&) {
  init::constant_(parameter, name == "weight" ? 1.0 : 0.0);
}

}  // namespace lockstep::nn
