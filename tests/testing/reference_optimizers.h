// PyTorch's update rules for one parameter, transcribed in float64: the independent reference
// every SGD and AdamW test (on any device) compares with.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "lockstep/optim/adamw.h"
#include "lockstep/optim/sgd.h"

namespace lockstep::testing {

// torch.optim.SGD (single tensor).
struct ReferenceSGD {
  explicit ReferenceSGD(const optim::SGDOptions& options) : o(options) {}

  optim::SGDOptions o;
  std::vector<double> buf;  // the momentum buffer, empty before the first step

  void step(std::vector<double>& p, std::vector<double> g) {
    for (size_t i = 0; i < p.size(); ++i)
      if (o.weight_decay != 0) g[i] += o.weight_decay * p[i];
    if (o.momentum != 0) {
      if (buf.empty()) {
        buf = g;
      } else {
        for (size_t i = 0; i < p.size(); ++i) buf[i] = o.momentum * buf[i] + (1 - o.dampening) * g[i];
      }
      for (size_t i = 0; i < p.size(); ++i) g[i] = o.nesterov ? g[i] + o.momentum * buf[i] : buf[i];
    }
    for (size_t i = 0; i < p.size(); ++i) p[i] -= o.lr * g[i];
  }
};

// torch.optim.AdamW's documented algorithm.
struct ReferenceAdamW {
  explicit ReferenceAdamW(const optim::AdamWOptions& options) : o(options) {}

  optim::AdamWOptions o;
  std::vector<double> m, v;  // the moments, empty before the first step
  int64_t t = 0;

  void step(std::vector<double>& p, const std::vector<double>& g) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(o.beta1, static_cast<double>(t)));
      const double v_hat = v[i] / (1 - std::pow(o.beta2, static_cast<double>(t)));
      p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  }
};

}  // namespace lockstep::testing
