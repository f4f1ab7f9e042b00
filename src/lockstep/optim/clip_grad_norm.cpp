#include "lockstep/optim/clip_grad_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/core/parallel.h"
#include "lockstep/ops/dispatch.h"
#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {
namespace {

// Partial sums over chunks of this many elements, added in chunk order: the same answer
// for any thread count.
constexpr int64_t kNormChunk = int64_t{1} << 14;

Tensor dense_grad(const Tensor& param, size_t index) {
  const Tensor g = param.grad();
  if (!g.defined()) return g;
  LOCKSTEP_CHECK(g.device().is_cpu()) << "clip_grad_norm: gradient of parameter " << index << " is on " << g.device()
                                      << ", and clipping runs on CPU devices only so far";
  if (g.is_contiguous()) return g;
  Tensor dense = Tensor::empty(g.shape(), g.dtype(), g.device());
  dense.copy_from(g);
  return dense;
}

template <typename T>
double sum_of_squares(const T* x, int64_t n) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  parallel_for(chunks, std::max<int64_t>(1, kUpdateGrain / kNormChunk), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t lo = c * kNormChunk, hi = std::min(n, lo + kNormChunk);
      double s = 0.0;
      for (int64_t i = lo; i < hi; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
      partial[static_cast<size_t>(c)] = s;
    }
  });
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  double total = 0.0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = dense_grad(params[i], i);
    if (!g.defined()) continue;
    ops::dispatch_float("clip_grad_norm", g.dtype(),
                        [&]<typename T>() { total += sum_of_squares(g.data<T>(), g.numel()); });
  }
  return std::sqrt(total);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, bool error_if_nonfinite) {
  LOCKSTEP_CHECK(max_norm > 0) << "clip_grad_norm: max_norm must be positive, got " << max_norm;
  const double norm = grad_norm(params);
  LOCKSTEP_CHECK(std::isfinite(norm) || !error_if_nonfinite)
      << "clip_grad_norm: the total gradient norm is " << norm
      << " (a NaN or infinite gradient); lower the learning rate or check the loss";
  const double coefficient = max_norm / (norm + 1e-6);
  if (!(coefficient < 1.0) && std::isfinite(norm)) return norm;
  NoGradGuard no_grad;
  for (const Tensor& param : params) {
    const Tensor g = param.grad();
    if (!g.defined()) continue;
    Tensor dense = g;
    if (!g.is_contiguous()) {
      dense = Tensor::empty(g.shape(), g.dtype(), g.device());
      dense.copy_from(g);
    }
    ops::dispatch_float("clip_grad_norm", g.dtype(), [&]<typename T>() {
      T* x = dense.data<T>();
      const T scale = static_cast<T>(coefficient);
      parallel_for(dense.numel(), kUpdateGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) x[i] = x[i] * scale;
      });
    });
    if (!dense.is_same(g)) g.copy_from(dense);
  }
  return norm;
}

}  // namespace lockstep::optim
