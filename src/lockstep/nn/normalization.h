// Normalization layers: LayerNorm (torch.nn.LayerNorm) normalizes over the trailing
// normalized_shape axes, then scales by weight (ones) and shifts by bias (zeros); BatchNorm1d
// and BatchNorm2d below.
#pragma once

#include <optional>
#include <string>
#include <vector>

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

// Batch normalization (torch.nn.BatchNorm1d, BatchNorm2d): each channel (axis 1) is normalized
// with statistics over every other axis, then scaled by weight (ones) and shifted by bias
// (zeros). Names and order as PyTorch's: weight, bias, then the buffers running_mean (zeros),
// running_var (ones), num_batches_tracked (i64, 0-d), so state_dicts move unchanged.
//
// Training normalizes with the micro-batch's own mean and biased variance; eval with the
// running statistics. With track_running_stats false there are no buffers and every forward
// uses the batch's statistics. A training forward folds the batch's mean and unbiased variance
// (n/(n-1) times the biased one) into the running statistics:
//   running = (1 - momentum) · running + momentum · batch_stat,  num_batches_tracked += 1,
// with momentum nullopt meaning the cumulative average (momentum = 1 / num_batches_tracked,
// PyTorch's momentum=None). Outside a parallel layout it does so at once, as PyTorch does.
// Under one (defer_step_statistics, see nn/module.h) the forward only adds the statistics to
// pending sums; take_step_statistics returns {mean_sum [C], var_sum [C], forwards [1]} in the
// running statistics' dtype (f32 unless changed; zeros when no forward ran) and starts the
// sums again from zero, and apply_step_statistics(sums) makes ONE update with mean_sum /
// forwards and var_sum / forwards (nothing when forwards is 0). The immediate update is that
// same function applied to one forward's sums. On CPU and CUDA devices: the pending sums and the
// update stay on the module's device (ops/batch_norm_running_stats.h): on a GPU neither makes
// the host wait for the GPU.
class BatchNorm : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  void reset_parameter(const std::string& name, const Tensor& parameter, Philox& rng) override;
  std::vector<Tensor> take_step_statistics() override;
  void apply_step_statistics(const std::vector<Tensor>& sums) override;
  // Running mean 0, variance 1, num_batches_tracked 0, and no pending sums (PyTorch's reset_running_stats).
  void reset_running_stats();

  const int64_t num_features;
  const double eps;
  const std::optional<double> momentum;
  const bool affine, track_running_stats;
  Tensor weight;  // [num_features]; undefined without affine
  Tensor bias;
  Tensor running_mean;         // [num_features]; these three undefined without track_running_stats
  Tensor running_var;          // [num_features]
  Tensor num_batches_tracked;  // i64, 0-d

 protected:
  BatchNorm(std::string type_name, int64_t num_features, double eps, std::optional<double> momentum, bool affine,
            bool track_running_stats);
  // Throws unless x has the rank this layer takes (BatchNorm1d: 2 or 3, BatchNorm2d: 4).
  virtual void check_rank(const Tensor& x) const = 0;

 private:
  void make_pending();
  Tensor pending_mean_, pending_var_, pending_forwards_;  // undefined until a forward or take needs them
};

// Input [N, C] or [N, C, L].
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm("BatchNorm1d", num_features, eps, momentum, affine, track_running_stats) {}

 protected:
  void check_rank(const Tensor& x) const override;
};

// Input [N, C, H, W].
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm("BatchNorm2d", num_features, eps, momentum, affine, track_running_stats) {}

 protected:
  void check_rank(const Tensor& x) const override;
};

}  // namespace lockstep::nn
