// max_pool2d and avg_pool2d written out as direct float64 loops, the reference the pool tests
// on every device compare with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "lockstep/core/tensor.h"
#include "lockstep/ops/conv.h"

namespace lockstep::testing {

// An input shape ([N, C, H, W] or [C, H, W]) and the pool's arguments; a zero stride means
// the kernel's, as in the ops.
struct PoolCase {
  Shape x;
  Pair kernel, stride, padding;
};

// Both pools of one input and their gradients of Σ out · dy, in row-major order.
struct NaivePool {
  std::vector<double> max, avg, max_grad, avg_grad;
};

// Loops over every plane of x (all leading axes): the max, the first one in row-major window
// order on ties (so its pixel gets the gradient), and the mean with padding counted in the
// divisor. s is the actual stride (never zero).
inline NaivePool naive_pool(const Tensor& x, const Tensor& dy, Pair k, Pair s, Pair p) {
  const auto xv = x.to_vector<double>(), gv = dy.to_vector<double>();
  const int64_t planes = x.numel() / (x.size(-2) * x.size(-1)), H = x.size(-2), W = x.size(-1);
  const int64_t OH = (H + 2 * p[0] - k[0]) / s[0] + 1, OW = (W + 2 * p[1] - k[1]) / s[1] + 1;
  NaivePool r{{}, {}, std::vector<double>(xv.size()), std::vector<double>(xv.size())};
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const double d = gv[static_cast<size_t>((pl * OH + oh) * OW + ow)];
        double best = -std::numeric_limits<double>::infinity(), total = 0;
        size_t best_at = 0;
        for (int64_t kh = 0; kh < k[0]; ++kh)
          for (int64_t kw = 0; kw < k[1]; ++kw) {
            const int64_t ih = oh * s[0] - p[0] + kh, iw = ow * s[1] - p[1] + kw;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            const size_t at = static_cast<size_t>((pl * H + ih) * W + iw);
            total += xv[at];
            r.avg_grad[at] += d / static_cast<double>(k[0] * k[1]);
            if (xv[at] > best) best = xv[at], best_at = at;
          }
        r.max.push_back(best);
        r.avg.push_back(total / static_cast<double>(k[0] * k[1]));
        r.max_grad[best_at] += d;
      }
  return r;
}

}  // namespace lockstep::testing
