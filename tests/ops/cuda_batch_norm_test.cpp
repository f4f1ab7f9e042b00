// batch_norm on each test device, forward and every gradient, in training and eval, against a
// float64 reference written here in naive loops: the statistics by their definition and the
// gradients by the chain rule through each intermediate (Ioffe and Szegedy's backward, not the
// closed form the op uses). [N, C] and [N, C, L] and [N, C, H, W] inputs; channels with fewer
// and more values than a GPU block has threads, planes longer than the block; with and
// without weight and bias; running statistics in f32 and f64; empty batches in eval; and
// bit-identical reruns.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/ops/batch_norm.h"
#include "testing/device_tensors.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::copy_to;
using testing::expect_close;
using testing::expect_identical;
using testing::leaf_on;
using testing::random_f64;
using testing::reference_rtol;

// The input viewed as [N, C, S], S the product of the axes after the channel axis.
struct ChannelView {
  int64_t n, c, s;
  size_t at(int64_t i, int64_t ch, int64_t k) const { return static_cast<size_t>((i * c + ch) * s + k); }
};

ChannelView view_of(const Shape& shape) {
  ChannelView v{shape[0], shape[1], 1};
  for (size_t axis = 2; axis < shape.size(); ++axis) v.s *= shape[axis];
  return v;
}

// What the reference and the op give, host-side: the output, the training statistics (empty
// in eval) and the gradients of x, weight and bias (empty where not asked for).
struct Expected {
  std::vector<double> y, mean, unbiased_var, dx, dw, db;
};

// Training: each channel's batch mean and biased variance; eval: running_mean and running_var.
// w and b empty for absent parameters.
Expected reference(const Shape& shape, const std::vector<double>& x, const std::vector<double>& w,
                   const std::vector<double>& b, const std::vector<double>& dy, bool training,
                   const std::vector<double>& running_mean, const std::vector<double>& running_var, double eps) {
  const ChannelView v = view_of(shape);
  const auto count = static_cast<double>(v.n * v.s);
  Expected e;
  e.y.resize(x.size());
  e.dx.resize(x.size());
  for (int64_t ch = 0; ch < v.c; ++ch) {
    const auto cc = static_cast<size_t>(ch);
    const double weight = w.empty() ? 1.0 : w[cc], bias = b.empty() ? 0.0 : b[cc];
    double mean = 0, var = 0;
    if (training) {
      for (int64_t i = 0; i < v.n; ++i)
        for (int64_t k = 0; k < v.s; ++k) mean += x[v.at(i, ch, k)];
      mean /= count;
      for (int64_t i = 0; i < v.n; ++i)
        for (int64_t k = 0; k < v.s; ++k) var += (x[v.at(i, ch, k)] - mean) * (x[v.at(i, ch, k)] - mean);
      e.mean.push_back(mean);
      e.unbiased_var.push_back(var / (count - 1));
      var /= count;
    } else {
      mean = running_mean[cc];
      var = running_var[cc];
    }
    const double rstd = 1.0 / std::sqrt(var + eps);
    double dw = 0, db = 0, dvar = 0, dmean = 0, deviation_sum = 0;
    for (int64_t i = 0; i < v.n; ++i) {
      for (int64_t k = 0; k < v.s; ++k) {
        const size_t j = v.at(i, ch, k);
        const double xhat = (x[j] - mean) * rstd;
        e.y[j] = xhat * weight + bias;
        const double dxhat = dy[j] * weight;
        dw += dy[j] * xhat;
        db += dy[j];
        // ∂L/∂var and ∂L/∂mean through x̂ (training only: in eval both are constants).
        dvar += dxhat * (x[j] - mean) * -0.5 * std::pow(var + eps, -1.5);
        dmean += dxhat * -rstd;
        deviation_sum += -2.0 * (x[j] - mean);
      }
    }
    if (training) dmean += dvar * deviation_sum / count;
    for (int64_t i = 0; i < v.n; ++i) {
      for (int64_t k = 0; k < v.s; ++k) {
        const size_t j = v.at(i, ch, k);
        e.dx[j] = dy[j] * weight * rstd;
        if (training) e.dx[j] += dvar * 2.0 * (x[j] - mean) / count + dmean / count;
      }
    }
    e.dw.push_back(dw);
    e.db.push_back(db);
  }
  return e;
}

struct Case {
  Shape shape;
  bool weight, bias;
  double eps;
};

// The inputs of one case in dtype (host tensors, already rounded), and the op's results.
struct Inputs {
  Tensor x, w, b, dy, running_mean, running_var;
};

Inputs inputs_for(const Case& c, DType dtype, DType running_dtype, uint64_t seed) {
  const Shape channels{c.shape[1]};
  Inputs in;
  // Channels with an offset and a spread, as activations have.
  in.x = random_f64(c.shape, seed, -3, 5).to(dtype);
  if (c.weight) in.w = random_f64(channels, seed + 1, 0.5, 1.5).to(dtype);
  if (c.bias) in.b = random_f64(channels, seed + 2).to(dtype);
  in.dy = random_f64(c.shape, seed + 3).to(dtype);
  in.running_mean = random_f64(channels, seed + 4, 0, 2).to(running_dtype);
  in.running_var = random_f64(channels, seed + 5, 0.5, 4).to(running_dtype);
  return in;
}

std::vector<double> host_values(const Tensor& t) { return t.defined() ? t.to_vector<double>() : std::vector<double>{}; }

Expected reference_for(const Case& c, const Inputs& in, bool training) {
  return reference(c.shape, host_values(in.x), host_values(in.w), host_values(in.b), host_values(in.dy), training,
                   host_values(in.running_mean), host_values(in.running_var), c.eps);
}

// Runs batch_norm and its backward on device; the results copied to the CPU (undefined where
// not asked for).
struct Actual {
  Tensor y, mean, unbiased_var, dx, dw, db;
};

Actual run_batch_norm(const Case& c, const Inputs& in, bool training, Device device, bool need_x = true) {
  const Tensor x = leaf_on(in.x, device, need_x);
  const Tensor w = c.weight ? leaf_on(in.w, device) : Tensor();
  const Tensor b = c.bias ? leaf_on(in.b, device) : Tensor();
  const Tensor rm = training ? Tensor() : copy_to(in.running_mean, in.running_mean.dtype(), device);
  const Tensor rv = training ? Tensor() : copy_to(in.running_var, in.running_var.dtype(), device);
  const BatchNormResult r = batch_norm(x, rm, rv, w, b, training, c.eps);
  EXPECT_EQ(r.output.device(), device);
  EXPECT_EQ(r.output.dtype(), in.x.dtype());
  Actual a;
  a.y = r.output.to(Device::cpu());
  if (training) {
    EXPECT_EQ(r.mean.device(), device);
    EXPECT_EQ(r.mean.dtype(), DType::f64);
    a.mean = r.mean.to(Device::cpu());
    a.unbiased_var = r.unbiased_var.to(Device::cpu());
  }
  if (!r.output.requires_grad()) return a;
  r.output.backward(copy_to(in.dy, in.dy.dtype(), device));
  if (need_x) a.dx = x.grad().to(Device::cpu());
  if (c.weight) a.dw = w.grad().to(Device::cpu());
  if (c.bias) a.db = b.grad().to(Device::cpu());
  return a;
}

// Each result within dtype's rounding of the reference (relative, and absolute against the
// largest element, for elements that cancel to near 0).
void expect_matches(const Actual& a, const Expected& e, const Case& c, DType dtype, bool need_x = true) {
  const double rtol = reference_rtol(dtype);
  const auto largest = [](const std::vector<double>& v) {
    double m = 0;
    for (const double x : v) m = std::max(m, std::abs(x));
    return m;
  };
  const auto close = [&](const Tensor& actual, const std::vector<double>& expected, const char* what) {
    SCOPED_TRACE(what);
    expect_close(actual, expected, rtol, rtol * largest(expected));
  };
  close(a.y, e.y, "output");
  if (a.mean.defined()) {
    // The statistics stay f64: near-exact whatever the input dtype.
    expect_close(a.mean, e.mean, 1e-12, 1e-12 * largest(e.mean));
    expect_close(a.unbiased_var, e.unbiased_var, 1e-12, 1e-12 * largest(e.unbiased_var));
  }
  if (need_x) close(a.dx, e.dx, "grad x");
  if (c.weight) close(a.dw, e.dw, "grad weight");
  if (c.bias) close(a.db, e.db, "grad bias");
}

const std::vector<Case>& shapes() {
  static const std::vector<Case> cases = {
      {{8, 5}, true, true, 1e-5},            // [N, C]: one value per sample and channel
      {{600, 3}, true, false, 1e-5},         // more values per channel than a block has threads
      {{4, 3, 5, 7}, true, true, 1e-5},      // [N, C, H, W], planes shorter than a block
      {{2, 2, 33, 17}, false, true, 1e-3},   // planes longer than a block
      {{5, 2, 3, 100}, true, true, 1e-5},    // planes of 300: a thread's next value lies in the next sample
      {{3, 4, 7}, false, false, 0.0},        // [N, C, L], no affine parameters, eps 0
      {{16, 16, 28, 28}, true, true, 1e-5},  // a ResNet's first stage at micro-batch 16
  };
  return cases;
}

class CudaBatchNorm : public testing::DeviceTest {};

TEST_P(CudaBatchNorm, TrainingMatchesTheFloat64Reference) {
  const Device device = GetParam();
  uint64_t seed = 100;
  for (const Case& c : shapes()) {
    for (DType dtype : {DType::f32, DType::f64}) {
      SCOPED_TRACE(shape_str(c.shape) + " " + dtype_name(dtype) + (c.weight ? " weight" : "") +
                   (c.bias ? " bias" : ""));
      const Inputs in = inputs_for(c, dtype, DType::f32, seed += 10);
      expect_matches(run_batch_norm(c, in, true, device), reference_for(c, in, true), c, dtype);
    }
  }
}

TEST_P(CudaBatchNorm, EvalMatchesTheFloat64Reference) {
  const Device device = GetParam();
  std::vector<Case> cases = shapes();
  cases.push_back({{0, 3, 2, 2}, true, true, 1e-5});  // no samples: the parameters' gradients are 0
  uint64_t seed = 200;
  for (const Case& c : cases) {
    for (DType dtype : {DType::f32, DType::f64}) {
      for (DType running : {DType::f32, DType::f64}) {
        SCOPED_TRACE(shape_str(c.shape) + " " + dtype_name(dtype) + ", running statistics " + dtype_name(running) +
                     (c.weight ? " weight" : "") + (c.bias ? " bias" : ""));
        const Inputs in = inputs_for(c, dtype, running, seed += 10);
        expect_matches(run_batch_norm(c, in, false, device), reference_for(c, in, false), c, dtype);
      }
    }
  }
}

TEST_P(CudaBatchNorm, OnlyTheParametersNeedGradients) {
  const Device device = GetParam();
  const Case c{{6, 4, 3, 3}, true, true, 1e-5};
  for (const bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "eval");
    const Inputs in = inputs_for(c, DType::f64, DType::f64, 300);
    const Actual a = run_batch_norm(c, in, training, device, /*need_x=*/false);
    EXPECT_FALSE(a.dx.defined());
    expect_matches(a, reference_for(c, in, training), c, DType::f64, /*need_x=*/false);
  }
}

TEST_P(CudaBatchNorm, OnlyTheInputNeedsAGradient) {
  const Device device = GetParam();
  // Without parameters, eval's input gradient needs no sums at all; training's still does.
  const Case c{{5, 3, 4, 2}, false, false, 1e-5};
  for (const bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "eval");
    const Inputs in = inputs_for(c, DType::f32, DType::f32, 310);
    expect_matches(run_batch_norm(c, in, training, device), reference_for(c, in, training), c, DType::f32);
  }
}

TEST_P(CudaBatchNorm, ConstantChannelsNormalizeToTheBias) {
  const Device device = GetParam();
  // Variance 0: x - mean is exactly 0, so y is the bias and the unbiased variance is 0.
  const Tensor x = Tensor::full({4, 3, 5, 5}, 2.5, DType::f32, device);
  const Tensor w = Tensor::full({3}, 3.0, DType::f32, device);
  const Tensor b = Tensor::full({3}, -0.25, DType::f32, device);
  const BatchNormResult r = batch_norm(x, Tensor(), Tensor(), w, b, true);
  for (double v : r.output.to_vector<double>()) ASSERT_EQ(v, -0.25);
  EXPECT_EQ(r.mean.to_vector<double>(), std::vector<double>(3, 2.5));
  EXPECT_EQ(r.unbiased_var.to_vector<double>(), std::vector<double>(3, 0.0));
}

TEST_P(CudaBatchNorm, RunsAreBitIdentical) {
  const Device device = GetParam();
  const Case c{{16, 16, 28, 28}, true, true, 1e-5};
  const Inputs in = inputs_for(c, DType::f32, DType::f32, 400);
  for (const bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "eval");
    const Actual first = run_batch_norm(c, in, training, device);
    const Actual second = run_batch_norm(c, in, training, device);
    expect_identical(first.y, second.y);
    if (training) {
      expect_identical(first.mean, second.mean);
      expect_identical(first.unbiased_var, second.unbiased_var);
    }
    expect_identical(first.dx, second.dx);
    expect_identical(first.dw, second.dw);
    expect_identical(first.db, second.db);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaBatchNorm, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
