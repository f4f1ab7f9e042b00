// Batch normalization with a fused backward. x is viewed as [N, C, S] (S the product of the
// axes after the channel axis); channel c holds the n = N·S values x[i, c, s]. Forward keeps
// each channel's mean and 1/std (f64) for backward, whose input gradient in training is the
// closed form
//   dx = rstd · w · (dy - mean(dy) - x̂ · mean(dy · x̂)),  x̂ = (x - mean) · rstd,
// and in eval (constant statistics) dx = rstd · w · dy. The weight gradient is Σ dy · x̂ and
// the bias gradient Σ dy over the channel. Every per-channel sum runs over the channel's
// values in (i, s) order into 8 f64 accumulators taken in turn, folded in a fixed order, and
// threads split the channels: results do not depend on the thread count. On a GPU the kernels
// of ops/cuda/batch_norm_kernels do the same, each channel's sums one block's fixed tree.
#include "lockstep/ops/batch_norm.h"

#include <cmath>
#include <string>
#include <vector>

#include "lockstep/autograd/node.h"
#include "lockstep/core/parallel.h"
#include "lockstep/ops/dispatch.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/ops/cuda/batch_norm_kernels.h"
#endif

namespace lockstep {
namespace {

// Per channel, f64 [C] on the input's device: the mean and 1/sqrt(var + eps) the output was normalized with.
struct ChannelStats {
  Tensor mean, rstd;
};

struct ChannelLayout {
  int64_t batch = 0, channels = 0, spatial = 1;
  int64_t count() const { return batch * spatial; }  // values per channel
};

template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// Σ f(index) over channel c's values, in (i, s) order, in f64 with 8 accumulators taken in
// turn and added in a fixed order: as deterministic as one running sum, with a shorter chain.
template <typename F>
double channel_sum(const ChannelLayout& l, int64_t c, const F& f) {
  double acc[8] = {};
  int k = 0;
  for (int64_t i = 0; i < l.batch; ++i) {
    const int64_t base = (i * l.channels + c) * l.spatial;
    for (int64_t s = 0; s < l.spatial; ++s) {
      acc[k] += f(base + s);
      k = (k + 1) & 7;
    }
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Runs body(c) for every channel, threads splitting the channels into chunks of about 8192 values.
template <typename Body>
void for_each_channel(const ChannelLayout& l, const Body& body) {
  parallel_for(l.channels, std::max<int64_t>(1, 8192 / std::max<int64_t>(l.count(), 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t c = begin; c < end; ++c) body(c);
               });
}

// Training: the batch statistics (mean and unbiased variance into mean_out and var_out, f64
// [C]); eval: running_mean and running_var (f64, [C]). Either way writes y and returns the
// statistics y was normalized with.
template <typename T>
ChannelStats batch_norm_forward(const T* x, const T* w, const T* b, T* y, const ChannelLayout& l, bool training,
                                const double* running_mean, const double* running_var, double eps, double* mean_out,
                                double* var_out, Device device) {
  ChannelStats stats{Tensor::empty({l.channels}, DType::f64, device), Tensor::empty({l.channels}, DType::f64, device)};
  double* mean = stats.mean.data<double>();
  double* rstd = stats.rstd.data<double>();
  const auto n = static_cast<double>(l.count());
  for_each_channel(l, [&](int64_t c) {
    double m, var;
    if (training) {
      m = channel_sum(l, c, [x](int64_t j) { return static_cast<double>(x[j]); }) / n;
      const double squares = channel_sum(l, c, [x, m](int64_t j) { return (x[j] - m) * (x[j] - m); });
      var = squares / n;
      mean_out[c] = m;
      var_out[c] = squares / (n - 1);
    } else {
      m = running_mean[c];
      var = running_var[c];
    }
    const double s = 1.0 / std::sqrt(var + eps);
    mean[c] = m;
    rstd[c] = s;
    const double scale = w != nullptr ? s * w[c] : s;
    const double shift = b != nullptr ? static_cast<double>(b[c]) : 0.0;
    for (int64_t i = 0; i < l.batch; ++i) {
      const int64_t base = (i * l.channels + c) * l.spatial;
      for (int64_t j = base; j < base + l.spatial; ++j) y[j] = static_cast<T>((x[j] - m) * scale + shift);
    }
  });
  return stats;
}

// Any of dx, dw, db may be null (not needed).
template <typename T>
void batch_norm_backward(const T* x, const T* w, const T* dy, const ChannelStats& stats, const ChannelLayout& l,
                         bool training, T* dx, T* dw, T* db) {
  const double* mean = stats.mean.data<double>();
  const double* rstd = stats.rstd.data<double>();
  const auto n = static_cast<double>(l.count());
  for_each_channel(l, [&](int64_t c) {
    const double m = mean[c], s = rstd[c];
    double sum_dy = 0, sum_dy_xhat = 0;
    if (training || dw != nullptr || db != nullptr) {
      sum_dy = channel_sum(l, c, [dy](int64_t j) { return static_cast<double>(dy[j]); });
      sum_dy_xhat = channel_sum(l, c, [dy, x, m, s](int64_t j) { return dy[j] * ((x[j] - m) * s); });
    }
    if (dw != nullptr) dw[c] = static_cast<T>(sum_dy_xhat);
    if (db != nullptr) db[c] = static_cast<T>(sum_dy);
    if (dx == nullptr) return;
    const double scale = w != nullptr ? s * w[c] : s;
    const double a = training ? sum_dy / n : 0.0, k = training ? sum_dy_xhat / n : 0.0;
    for (int64_t i = 0; i < l.batch; ++i) {
      const int64_t base = (i * l.channels + c) * l.spatial;
      for (int64_t j = base; j < base + l.spatial; ++j) {
        dx[j] = static_cast<T>(scale * (dy[j] - a - (x[j] - m) * s * k));
      }
    }
  });
}

#if LOCKSTEP_HAVE_CUDA
template <typename T>
T* device_data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// batch_norm_forward on a GPU: the statistics (the batch's, written into mean_out and var_out,
// or the running ones, f64 [C]), then the output.
template <typename T>
ChannelStats batch_norm_forward_cuda(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                                     const ChannelLayout& l, bool training, const Tensor& running_mean,
                                     const Tensor& running_var, double eps, const Tensor& mean_out,
                                     const Tensor& var_out) {
  const Device device = x.device();
  ChannelStats stats{Tensor::empty({l.channels}, DType::f64, device), Tensor::empty({l.channels}, DType::f64, device)};
  lockstep::cuda::OnDevice on(device);
  if (training) {
    ops::cuda::batch_norm_statistics<T>(x.data_ptr<T>(), l.batch, l.channels, l.spatial, eps,
                                        stats.mean.data_ptr<double>(), stats.rstd.data_ptr<double>(),
                                        mean_out.data_ptr<double>(), var_out.data_ptr<double>(), on.stream());
  } else {
    ops::cuda::batch_norm_running_rstd(running_mean.data_ptr<double>(), running_var.data_ptr<double>(), l.channels, eps,
                                       stats.mean.data_ptr<double>(), stats.rstd.data_ptr<double>(), on.stream());
  }
  ops::cuda::batch_norm_normalize<T>(x.data_ptr<T>(), device_data_or_null<T>(w), device_data_or_null<T>(b),
                                     stats.mean.data_ptr<double>(), stats.rstd.data_ptr<double>(), y.data_ptr<T>(),
                                     l.batch, l.channels, l.spatial, on.stream());
  return stats;
}

// batch_norm_backward on a GPU; undefined dx, dw or db are not needed.
template <typename T>
void batch_norm_backward_cuda(const Tensor& x, const Tensor& w, const Tensor& dy, const ChannelStats& stats,
                              const ChannelLayout& l, bool training, const Tensor& dx, const Tensor& dw,
                              const Tensor& db) {
  lockstep::cuda::OnDevice on(x.device());
  // Σ dy and Σ dy · x̂ per channel: the parameters' gradients, and in training the input's
  // (eval's input gradient treats the statistics as constants and needs no sums).
  Tensor sums;
  if (training || dw.defined() || db.defined()) {
    sums = Tensor::empty({2 * l.channels}, DType::f64, x.device());
    ops::cuda::batch_norm_backward_sums<T>(x.data_ptr<T>(), dy.data_ptr<T>(), stats.mean.data_ptr<double>(),
                                           stats.rstd.data_ptr<double>(), l.batch, l.channels, l.spatial,
                                           sums.data_ptr<double>(), device_data_or_null<T>(dw),
                                           device_data_or_null<T>(db), on.stream());
  }
  if (!dx.defined()) return;
  ops::cuda::batch_norm_backward_input<T>(x.data_ptr<T>(), device_data_or_null<T>(w), dy.data_ptr<T>(),
                                          stats.mean.data_ptr<double>(), stats.rstd.data_ptr<double>(),
                                          training ? sums.data_ptr<double>() : nullptr, dx.data_ptr<T>(), l.batch,
                                          l.channels, l.spatial, on.stream());
}
#endif

// A [C] f32 or f64 tensor as contiguous f64.
Tensor as_f64(const Tensor& t) { return t.dtype() == DType::f64 ? t.contiguous() : t.to(DType::f64); }

}  // namespace

BatchNormResult batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                           const Tensor& bias, bool training, double eps) {
  const Device device = ops::common_device("batch_norm", {x, running_mean, running_var, weight, bias});
  ops::require_device("batch_norm", device);
  ops::require_float("batch_norm", x);
  LOCKSTEP_CHECK(x.dim() >= 2) << "batch_norm: input must be [N, C] or [N, C, ...], got shape " << shape_str(x.shape());
  ChannelLayout l;
  l.batch = x.size(0);
  l.channels = x.size(1);
  for (int64_t axis = 2; axis < x.dim(); ++axis) l.spatial *= x.size(axis);
  const Shape channel_shape{l.channels};
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"weight", weight}, {"bias", bias}}) {
    if (!t.defined()) continue;
    LOCKSTEP_CHECK(t.shape() == channel_shape && t.dtype() == x.dtype())
        << "batch_norm: " << name << " must be " << shape_str(channel_shape) << " " << dtype_name(x.dtype())
        << " (one per channel of the input " << shape_str(x.shape()) << "), got " << shape_str(t.shape()) << " "
        << dtype_name(t.dtype());
  }
  if (training) {
    LOCKSTEP_CHECK(l.count() > 1) << "batch_norm: expected more than 1 value per channel when training, got input "
                                  << shape_str(x.shape()) << " (" << l.count() << " per channel)";
  } else {
    LOCKSTEP_CHECK(running_mean.defined() && running_var.defined())
        << "batch_norm: outside training the input is normalized with running_mean and running_var, which must "
           "both be given";
    for (const auto& [name, t] :
         {std::pair<const char*, const Tensor&>{"running_mean", running_mean}, {"running_var", running_var}}) {
      LOCKSTEP_CHECK(t.shape() == channel_shape && (t.dtype() == DType::f32 || t.dtype() == DType::f64))
          << "batch_norm: " << name << " must be " << shape_str(channel_shape) << " f32 or f64 (one per channel of "
          << "the input " << shape_str(x.shape()) << "), got " << shape_str(t.shape()) << " " << dtype_name(t.dtype());
    }
  }
  LOCKSTEP_CHECK(eps >= 0 && std::isfinite(eps)) << "batch_norm: eps must be finite and >= 0, got " << eps;

  const Tensor xc = x.contiguous();
  const Tensor wc = weight.defined() ? weight.contiguous() : weight;
  const Tensor bc = bias.defined() ? bias.contiguous() : bias;
  const Tensor rm = training ? Tensor() : as_f64(running_mean);
  const Tensor rv = training ? Tensor() : as_f64(running_var);
  BatchNormResult result;
  result.output = Tensor::empty(x.shape(), x.dtype(), device);
  if (training) {
    result.mean = Tensor::empty(channel_shape, DType::f64, device);
    result.unbiased_var = Tensor::empty(channel_shape, DType::f64, device);
  }
  ChannelStats stats;
  ops::dispatch_float("batch_norm", x.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
    if (device.is_cuda()) {
      stats = batch_norm_forward_cuda<T>(xc, wc, bc, result.output, l, training, rm, rv, eps, result.mean,
                                         result.unbiased_var);
      return;
    }
#endif
    stats = batch_norm_forward<T>(xc.data<T>(), data_or_null<T>(wc), data_or_null<T>(bc), result.output.data<T>(), l,
                                  training, data_or_null<double>(rm), data_or_null<double>(rv), eps,
                                  training ? result.mean.data<double>() : nullptr,
                                  training ? result.unbiased_var.data<double>() : nullptr, device);
  });

  autograd::record("BatchNormBackward", {xc, wc, bc}, {result.output},
                   [x = xc.detach(), w = wc.defined() ? wc.detach() : Tensor(), stats, l, training, channel_shape,
                    need_x = xc.requires_grad(), need_w = wc.defined() && wc.requires_grad(),
                    need_b = bc.defined() && bc.requires_grad()](const std::vector<Tensor>& g) {
                     const Tensor grad = g[0].contiguous();
                     Tensor grad_x, grad_w, grad_b;
                     if (need_x) grad_x = Tensor::empty(x.shape(), x.dtype(), x.device());
                     if (need_w) grad_w = Tensor::empty(channel_shape, x.dtype(), x.device());
                     if (need_b) grad_b = Tensor::empty(channel_shape, x.dtype(), x.device());
                     ops::dispatch_float("batch_norm", x.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
                       if (x.device().is_cuda()) {
                         batch_norm_backward_cuda<T>(x, w, grad, stats, l, training, grad_x, grad_w, grad_b);
                         return;
                       }
#endif
                       batch_norm_backward<T>(x.data<T>(), data_or_null<T>(w), grad.data<T>(), stats, l, training,
                                              need_x ? grad_x.data<T>() : nullptr, need_w ? grad_w.data<T>() : nullptr,
                                              need_b ? grad_b.data<T>() : nullptr);
                     });
                     return std::vector<Tensor>{grad_x, grad_w, grad_b};
                   });
  return result;
}

}  // namespace lockstep
