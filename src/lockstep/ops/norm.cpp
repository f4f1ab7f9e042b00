// Layer normalization with a fused backward: per-row mean and 1/std are kept from forward
// (in f64, on the input's device), and the input gradient comes from the two row sums of the
// closed form
//   dx = rstd · (dx̂ - mean(dx̂) - x̂ · mean(dx̂ · x̂)),  dx̂ = dy · weight.
// The weight and bias gradients sum over rows in row order for each column, with threads
// splitting the columns, so they do not depend on the thread count. On a GPU the kernels of
// ops/cuda/norm_kernels do the same with fixed reduction trees.
#include "lockstep/ops/norm.h"

#include <cmath>
#include <vector>

#include "lockstep/autograd/node.h"
#include "lockstep/core/parallel.h"
#include "lockstep/ops/dispatch.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/ops/cuda/norm_kernels.h"
#endif

namespace lockstep {
namespace {

struct RowStats {
  Tensor mean, rstd;  // f64 [rows]
};

template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// Σ f(j) for j in [0, n) in f64 with 8 interleaved accumulators added in a fixed order: as
// deterministic as one running sum, without its add-latency chain.
template <typename F>
double ordered_sum(int64_t n, const F& f) {
  double acc[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) acc[k] += f(j + k);
  for (; j < n; ++j) acc[j & 7] += f(j);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <typename T>
RowStats layer_norm_forward(const T* x, const T* w, const T* b, T* y, int64_t rows, int64_t dim, double eps,
                            Device device) {
  RowStats stats{Tensor::empty({rows}, DType::f64, device), Tensor::empty({rows}, DType::f64, device)};
  double* mean = stats.mean.data<double>();
  double* rstd = stats.rstd.data<double>();
  parallel_for(rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(dim, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * dim;
      T* yr = y + r * dim;
      const double m =
          ordered_sum(dim, [xr](int64_t j) { return static_cast<double>(xr[j]); }) / static_cast<double>(dim);
      const double squares = ordered_sum(dim, [xr, m](int64_t j) { return (xr[j] - m) * (xr[j] - m); });
      const double s = 1.0 / std::sqrt(squares / static_cast<double>(dim) + eps);
      mean[r] = m;
      rstd[r] = s;
      for (int64_t j = 0; j < dim; ++j) {
        double v = (xr[j] - m) * s;
        if (w != nullptr) v *= w[j];
        if (b != nullptr) v += b[j];
        yr[j] = static_cast<T>(v);
      }
    }
  });
  return stats;
}

// Any of dx, dw, db may be null (not needed).
template <typename T>
void layer_norm_backward(const T* x, const T* w, const T* dy, const RowStats& stats, T* dx, T* dw, T* db, int64_t rows,
                         int64_t dim) {
  const double* mean = stats.mean.data<double>();
  const double* rstd = stats.rstd.data<double>();
  if (dx != nullptr) {
    parallel_for(rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(dim, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = x + r * dim;
        const T* gr = dy + r * dim;
        const double m = mean[r], sd = rstd[r];
        auto g_at = [gr, w](int64_t j) { return w != nullptr ? gr[j] * static_cast<double>(w[j]) : gr[j]; };
        const double sum_g = ordered_sum(dim, g_at);
        const double sum_gx = ordered_sum(dim, [&](int64_t j) { return g_at(j) * (xr[j] - m) * sd; });
        const double a = sum_g / static_cast<double>(dim), c = sum_gx / static_cast<double>(dim);
        T* dxr = dx + r * dim;
        for (int64_t j = 0; j < dim; ++j) dxr[j] = static_cast<T>(sd * (g_at(j) - a - (xr[j] - m) * sd * c));
      }
    });
  }
  if (dw == nullptr && db == nullptr) return;
  parallel_for(dim, std::max<int64_t>(1, 8192 / std::max<int64_t>(rows, 1)), [&](int64_t begin, int64_t end) {
    std::vector<double> sum_w(static_cast<size_t>(end - begin), 0.0), sum_b(static_cast<size_t>(end - begin), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * dim;
      const T* gr = dy + r * dim;
      for (int64_t j = begin; j < end; ++j) {
        sum_w[static_cast<size_t>(j - begin)] += gr[j] * (xr[j] - mean[r]) * rstd[r];
        sum_b[static_cast<size_t>(j - begin)] += gr[j];
      }
    }
    for (int64_t j = begin; j < end; ++j) {
      if (dw != nullptr) dw[j] = static_cast<T>(sum_w[static_cast<size_t>(j - begin)]);
      if (db != nullptr) db[j] = static_cast<T>(sum_b[static_cast<size_t>(j - begin)]);
    }
  });
}

#if LOCKSTEP_HAVE_CUDA
template <typename T>
T* device_data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

template <typename T>
RowStats layer_norm_forward_cuda(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, int64_t rows,
                                 int64_t dim, double eps) {
  const Device device = x.device();
  RowStats stats{Tensor::empty({rows}, DType::f64, device), Tensor::empty({rows}, DType::f64, device)};
  lockstep::cuda::OnDevice on(device);
  ops::cuda::layer_norm_forward<T>(x.data_ptr<T>(), device_data_or_null<T>(w), device_data_or_null<T>(b),
                                   y.data_ptr<T>(), stats.mean.data_ptr<double>(), stats.rstd.data_ptr<double>(), rows,
                                   dim, eps, on.stream());
  return stats;
}

// Undefined dx, dw or db are not needed.
template <typename T>
void layer_norm_backward_cuda(const Tensor& x, const Tensor& w, const Tensor& dy, const RowStats& stats,
                              const Tensor& dx, const Tensor& dw, const Tensor& db, int64_t rows, int64_t dim) {
  lockstep::cuda::OnDevice on(x.device());
  if (dx.defined()) {
    ops::cuda::layer_norm_backward_input<T>(x.data_ptr<T>(), device_data_or_null<T>(w), dy.data_ptr<T>(),
                                            stats.mean.data_ptr<double>(), stats.rstd.data_ptr<double>(),
                                            dx.data_ptr<T>(), rows, dim, on.stream());
  }
  if (!dw.defined() && !db.defined()) return;
  const Tensor scratch = Tensor::empty({ops::cuda::layer_norm_params_scratch(rows, dim)}, DType::f64, x.device());
  ops::cuda::layer_norm_backward_params<T>(
      x.data_ptr<T>(), dy.data_ptr<T>(), stats.mean.data_ptr<double>(), stats.rstd.data_ptr<double>(),
      device_data_or_null<T>(dw), device_data_or_null<T>(db), scratch.data_ptr<double>(), rows, dim, on.stream());
}
#endif

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  const Device device = ops::common_device("layer_norm", {x, weight, bias});
  ops::require_device("layer_norm", device);
  ops::require_float("layer_norm", x);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  bool match = k >= 1 && k <= x.dim();
  for (int64_t i = 0; match && i < k; ++i) match = x.size(x.dim() - k + i) == normalized_shape[static_cast<size_t>(i)];
  LOCKSTEP_CHECK(match) << "layer_norm: normalized_shape " << shape_str(normalized_shape)
                        << " must be non-empty and equal the last axes of the input " << shape_str(x.shape());
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"weight", weight}, {"bias", bias}}) {
    if (!t.defined()) continue;
    LOCKSTEP_CHECK(t.shape() == normalized_shape && t.dtype() == x.dtype())
        << "layer_norm: " << name << " must be " << shape_str(normalized_shape) << " " << dtype_name(x.dtype())
        << " (the normalized_shape), got " << shape_str(t.shape()) << " " << dtype_name(t.dtype());
  }
  LOCKSTEP_CHECK(eps >= 0 && std::isfinite(eps)) << "layer_norm: eps must be finite and >= 0, got " << eps;
  const int64_t dim = numel(normalized_shape);
  const int64_t rows = dim > 0 ? x.numel() / dim : 0;

  const Tensor xc = x.contiguous();
  const Tensor wc = weight.defined() ? weight.contiguous() : weight;
  const Tensor bc = bias.defined() ? bias.contiguous() : bias;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
  RowStats stats;
  ops::dispatch_float("layer_norm", x.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
    if (device.is_cuda()) {
      stats = layer_norm_forward_cuda<T>(xc, wc, bc, out, rows, dim, eps);
      return;
    }
#endif
    stats = layer_norm_forward<T>(xc.data<T>(), data_or_null<T>(wc), data_or_null<T>(bc), out.data<T>(), rows, dim, eps,
                                  device);
  });

  autograd::record("LayerNormBackward", {xc, wc, bc}, {out},
                   [x = xc.detach(), w = wc.defined() ? wc.detach() : Tensor(), stats, rows, dim,
                    shape = normalized_shape, need_x = xc.requires_grad(), need_w = wc.defined() && wc.requires_grad(),
                    need_b = bc.defined() && bc.requires_grad()](const std::vector<Tensor>& g) {
                     const Tensor grad = g[0].contiguous();
                     Tensor grad_x, grad_w, grad_b;
                     if (need_x) grad_x = Tensor::empty(x.shape(), x.dtype(), x.device());
                     if (need_w) grad_w = Tensor::empty(shape, x.dtype(), x.device());
                     if (need_b) grad_b = Tensor::empty(shape, x.dtype(), x.device());
                     ops::dispatch_float("layer_norm", x.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
                       if (x.device().is_cuda()) {
                         layer_norm_backward_cuda<T>(x, w, grad, stats, grad_x, grad_w, grad_b, rows, dim);
                         return;
                       }
#endif
                       layer_norm_backward<T>(x.data<T>(), data_or_null<T>(w), grad.data<T>(), stats,
                                              need_x ? grad_x.data<T>() : nullptr, need_w ? grad_w.data<T>() : nullptr,
                                              need_b ? grad_b.data<T>() : nullptr, rows, dim);
                     });
                     return std::vector<Tensor>{grad_x, grad_w, grad_b};
                   });
  return out;
}

}  // namespace lockstep
