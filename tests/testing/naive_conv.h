// conv2d written out as direct float64 loops, the reference the convolution tests on every
// device compare with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lockstep/core/tensor.h"
#include "lockstep/ops/conv.h"

namespace lockstep::testing {

// Input [N, C, H, W] and weight [O, C, KH, KW] shapes, and the convolution's arguments.
struct ConvCase {
  Shape x, w;
  Pair stride, padding;
};

// The output size along one axis.
inline int64_t conv_out_size(int64_t in, int64_t k, int64_t s, int64_t p) { return (in + 2 * p - k) / s + 1; }

// out[n, o, oh, ow] = b[o] + Σ x[n, c, ih, iw] · w[o, c, kh, kw], and the gradients of
// Σ out · dy, in row-major order.
struct NaiveConv {
  std::vector<double> out, dx, dw, db;
};

// The loops, in float64. b may be undefined (no bias); so may dy, when only the output is
// wanted (the gradients are then those of a zero dy).
inline NaiveConv naive_conv(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy, Pair s, Pair p) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t O = w.size(0), KH = w.size(2), KW = w.size(3);
  const int64_t OH = conv_out_size(H, KH, s[0], p[0]), OW = conv_out_size(W, KW, s[1], p[1]);
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>(static_cast<size_t>(O), 0.0);
  const auto gv = dy.defined() ? dy.to_vector<double>() : std::vector<double>(static_cast<size_t>(N * O * OH * OW));
  NaiveConv r{std::vector<double>(static_cast<size_t>(N * O * OH * OW)), std::vector<double>(xv.size()),
              std::vector<double>(wv.size()), std::vector<double>(static_cast<size_t>(O))};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const size_t at = static_cast<size_t>(((n * O + o) * OH + oh) * OW + ow);
          const double d = gv[at];
          double total = bv[static_cast<size_t>(o)];
          r.db[static_cast<size_t>(o)] += d;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t ih = oh * s[0] - p[0] + kh, iw = ow * s[1] - p[1] + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const size_t xi = static_cast<size_t>(((n * C + c) * H + ih) * W + iw);
                const size_t wi = static_cast<size_t>(((o * C + c) * KH + kh) * KW + kw);
                total += xv[xi] * wv[wi];
                r.dx[xi] += d * wv[wi];
                r.dw[wi] += d * xv[xi];
              }
          r.out[at] = total;
        }
  return r;
}

}  // namespace lockstep::testing
