// Tensors for tests that run ops on each test device: fresh copies on a device, and the
// comparisons of what comes back with a reference (the CPU op, or float64 loops).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "lockstep/core/tensor.h"

namespace lockstep::testing {

// A fresh tensor on device holding values' elements in dtype, in storage of its own: never a
// handle to values, which .to() hands back when nothing changes, so writing into one (an
// optimizer step) leaves the other alone.
inline Tensor copy_to(const Tensor& values, DType dtype, Device device) {
  Tensor out = Tensor::empty(values.shape(), dtype, device);
  out.copy_from(values);
  return out;
}

// A fresh leaf on device with values' elements (same dtype) that requires grad when asked, so
// that runs on two devices from the same host values keep their gradients apart.
inline Tensor leaf_on(const Tensor& values, Device device, bool requires_grad = true) {
  Tensor leaf = copy_to(values, values.dtype(), device);
  leaf.set_requires_grad(requires_grad);
  return leaf;
}

// The relative tolerance of a result in dtype against a float64 reference on the same
// (already rounded) inputs: f32's rounding over the sums the ops make, f64's near exact.
inline double reference_rtol(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-12; }

// The absolute tolerance of a sum of `terms` products of values in [-1, 1], in dtype: an
// element that cancels to near 0 still carries the rounding of its terms.
inline double sum_atol(DType dtype, int64_t terms) {
  return (dtype == DType::f32 ? 2e-6 : 1e-14) * static_cast<double>(terms + 1);
}

// The largest |element|, for absolute tolerances that scale with the values.
inline double max_abs(const Tensor& t) {
  double m = 0;
  for (const double v : t.to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

// Every element of actual (on any device) within atol + rtol · |expected|, and NaN only where
// expected is NaN; one failure naming how many differ and the worst.
inline void expect_close(const Tensor& actual, const std::vector<double>& expected, double rtol, double atol) {
  const auto a = actual.to_vector<double>();
  ASSERT_EQ(a.size(), expected.size());
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double excess = std::abs(a[i] - expected[i]) - (atol + rtol * std::abs(expected[i]));
    if (excess > 0 || std::isnan(a[i]) != std::isnan(expected[i])) {
      ++bad;
      if (worst < 0 || excess > worst_excess) {
        worst = static_cast<int64_t>(i);
        worst_excess = excess;
      }
    }
  }
  EXPECT_EQ(bad, 0) << bad << " of " << a.size() << " elements differ; worst at " << worst << ": "
                    << (worst >= 0 ? a[static_cast<size_t>(worst)] : 0.0) << " vs "
                    << (worst >= 0 ? expected[static_cast<size_t>(worst)] : 0.0);
}

inline void expect_close(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  ASSERT_EQ(actual.shape(), expected.shape());
  expect_close(actual, expected.to_vector<double>(), rtol, atol);
}

// The same shape, dtype and bits, element for element (through f64, which holds every f32 and
// every integer these tests use exactly): a NaN matches only a NaN of the same bits, and -0
// does not match +0.
inline void expect_identical(const Tensor& actual, const Tensor& expected) {
  ASSERT_EQ(actual.shape(), expected.shape());
  ASSERT_EQ(actual.dtype(), expected.dtype());
  const auto a = actual.to_vector<double>(), e = expected.to_vector<double>();
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint64_t>(a[i]) != std::bit_cast<uint64_t>(e[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++differ;
    }
  }
  EXPECT_EQ(differ, 0) << differ << " of " << a.size() << " elements differ, the first at " << first << ": "
                       << (first >= 0 ? a[static_cast<size_t>(first)] : 0.0) << " vs "
                       << (first >= 0 ? e[static_cast<size_t>(first)] : 0.0);
}

}  // namespace lockstep::testing
