// Test helpers: finite-difference gradient checks in float64 and tensor comparisons.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/core/philox.h"
#include "lockstep/core/tensor.h"

namespace lockstep::testing {

// A float64 tensor of the shape with uniform values in [low, high) from `seed`.
inline Tensor random_f64(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) {
  Tensor t = Tensor::empty(shape, DType::f64);
  Philox rng(seed, 999);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = low + (high - low) * rng.next_double();
  return t;
}

inline Tensor random_f32(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) {
  return random_f64(shape, seed, low, high).to(DType::f32);
}

// Checks d(sum(f(inputs) * R))/d(input) from backward against central differences, for
// every input that requires grad. Inputs must be f64 leaves. R is a fixed random tensor so
// every output element matters.
inline void expect_gradients_match(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                   const std::vector<Tensor>& inputs, double eps = 1e-6, double tolerance = 1e-6) {
  for (const Tensor& t : inputs) t.set_grad(Tensor());
  Tensor out = f(inputs);
  ASSERT_TRUE(out.requires_grad()) << "output does not require grad";
  const Tensor projection = random_f64(out.shape(), 12345);
  out.backward(projection.to(out.dtype()));

  auto objective = [&]() {
    NoGradGuard no_grad;
    const auto values = f(inputs).to_vector<double>();
    const double* r = projection.data<double>();
    double total = 0;
    for (size_t i = 0; i < values.size(); ++i) total += values[i] * r[i];
    return total;
  };

  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& input = inputs[k];
    if (!input.requires_grad()) continue;
    ASSERT_EQ(input.dtype(), DType::f64) << "gradcheck inputs must be f64";
    ASSERT_TRUE(input.grad().defined()) << "input " << k << " got no gradient";
    const auto analytic = input.grad().to_vector<double>();
    double* base = input.data<double>();
    for (int64_t i = 0; i < input.numel(); ++i) {
      // Element i in logical (row-major) order, wherever the strides put it.
      int64_t offset = 0;
      for (int64_t axis = input.dim() - 1, rest = i; axis >= 0; --axis) {
        offset += rest % input.size(axis) * input.strides()[static_cast<size_t>(axis)];
        rest /= input.size(axis);
      }
      double* p = base + offset;
      const double saved = *p;
      *p = saved + eps;
      const double plus = objective();
      *p = saved - eps;
      const double minus = objective();
      *p = saved;
      const double numeric = (plus - minus) / (2 * eps);
      EXPECT_NEAR(analytic[static_cast<size_t>(i)], numeric, tolerance * (1 + std::abs(numeric)))
          << "input " << k << " element " << i;
    }
  }
}

// Every element of actual within atol + rtol * |expected|.
inline void expect_all_close(const Tensor& actual, const std::vector<double>& expected, double rtol = 1e-6,
                             double atol = 1e-6) {
  const auto values = actual.to_vector<double>();
  ASSERT_EQ(values.size(), expected.size());
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_NEAR(values[i], expected[i], atol + rtol * std::abs(expected[i])) << "element " << i;
}

inline void expect_all_close(const Tensor& actual, const Tensor& expected, double rtol = 1e-6, double atol = 1e-6) {
  ASSERT_EQ(actual.shape(), expected.shape());
  expect_all_close(actual, expected.to_vector<double>(), rtol, atol);
}

}  // namespace lockstep::testing
