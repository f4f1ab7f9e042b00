// The elementwise ops on every test device against references written out here: binary ops
// and scalar affine ops must equal IEEE arithmetic in the tensor's dtype exactly; the
// activations and all gradients must match float64 formulas within the dtype's tolerance.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/ops/elementwise.h"
#include "lockstep/ops/shape_ops.h"
#include "testing/device_tensors.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::leaf_on;
using testing::random_f64;
using testing::reference_rtol;

class CudaElementwise : public testing::DeviceTest {};

// Row-major index into an operand of shape s (contiguous) for element `flat` of out_shape,
// under NumPy broadcasting: missing and size-1 axes read index 0.
int64_t operand_index(const Shape& s, const Shape& out_shape, int64_t flat) {
  int64_t index = 0, stride = 1;
  const size_t lead = out_shape.size() - s.size();
  for (size_t k = out_shape.size(); k-- > 0;) {
    const int64_t coord = flat % out_shape[k];
    flat /= out_shape[k];
    if (k < lead) continue;
    const int64_t size = s[k - lead];
    index += (size == 1 ? 0 : coord) * stride;
    stride *= size;
  }
  return index;
}

Shape broadcast_of(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

struct ShapePair {
  Shape a, b;
};

// Same shapes (an odd size), row and column operands, scalars on either side, both operands
// broadcast, a broadcast middle axis with ranks that differ, and an empty output.
const std::vector<ShapePair> kShapePairs = {
    {{1037}, {1037}},
    {{5, 1031}, {1031}},
    {{5, 1031}, {5, 1}},
    {{}, {3, 4}},
    {{1300}, {1}},
    {{2, 1, 7}, {1, 3, 1}},
    {{4, 3, 2, 5}, {3, 1, 5}},
    {{0, 3}, {3}},
    {{3, 1, 1100}, {1, 2, 1}},
};

template <typename T>
struct BinaryOpCase {
  const char* name;
  Tensor (*op)(const Tensor&, const Tensor&);
  T (*apply)(T, T);
};

template <typename T>
std::vector<BinaryOpCase<T>> binary_op_cases() {
  return {{"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, [](T x, T y) { return x + y; }},
          {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, [](T x, T y) { return x - y; }},
          {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, [](T x, T y) { return x * y; }},
          {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, [](T x, T y) { return x / y; }}};
}

template <typename T>
void expect_binary_ops_exact(Device device) {
  uint64_t seed = 1;
  for (const ShapePair& shapes : kShapePairs) {
    // b stays away from 0 so that div is well conditioned; its sign varies with a's.
    const Tensor a = random_f64(shapes.a, seed++, -2, 2).to(dtype_of<T>());
    const Tensor b = random_f64(shapes.b, seed++, 0.5, 3).to(dtype_of<T>());
    const auto va = a.to_vector<T>(), vb = b.to_vector<T>();
    const Shape out_shape = broadcast_of(shapes.a, shapes.b);
    for (const auto& c : binary_op_cases<T>()) {
      SCOPED_TRACE(std::string(c.name) + " " + shape_str(shapes.a) + " " + shape_str(shapes.b) + " " +
                   dtype_name(dtype_of<T>()));
      const Tensor out = c.op(a.to(device), b.to(device));
      ASSERT_EQ(out.device(), device);
      ASSERT_EQ(out.shape(), out_shape);
      const auto got = out.to_vector<T>();
      ASSERT_EQ(static_cast<int64_t>(got.size()), numel(out_shape));
      for (int64_t i = 0; i < numel(out_shape); ++i) {
        const T expected = c.apply(va[static_cast<size_t>(operand_index(shapes.a, out_shape, i))],
                                   vb[static_cast<size_t>(operand_index(shapes.b, out_shape, i))]);
        ASSERT_EQ(got[static_cast<size_t>(i)], expected) << "element " << i;
      }
    }
  }
}

TEST_P(CudaElementwise, BinaryOpsWithBroadcastingAreExactIeeeArithmetic) {
  expect_binary_ops_exact<float>(GetParam());
  expect_binary_ops_exact<double>(GetParam());
}

// Each operand's gradient, summed over the axes it was broadcast along, against float64 sums
// of the partial derivatives.
template <typename T>
void expect_binary_gradients(Device device) {
  // Rounding in a sum of n terms is bounded by a multiple of eps · sum |term|.
  const double eps = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  uint64_t seed = 100;
  struct Derivatives {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&);
    double (*da)(double, double);
    double (*db)(double, double);
  };
  const std::vector<Derivatives> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, [](double, double) { return 1.0; },
       [](double, double) { return 1.0; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, [](double, double) { return 1.0; },
       [](double, double) { return -1.0; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, [](double, double y) { return y; },
       [](double x, double) { return x; }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, [](double, double y) { return 1 / y; },
       [](double x, double y) { return -x / (y * y); }},
  };
  for (const ShapePair& shapes : kShapePairs) {
    const Shape out_shape = broadcast_of(shapes.a, shapes.b);
    const Tensor a = random_f64(shapes.a, seed++, -2, 2).to(dtype_of<T>());
    const Tensor b = random_f64(shapes.b, seed++, 0.5, 3).to(dtype_of<T>());
    const Tensor g = random_f64(out_shape, seed++).to(dtype_of<T>());
    const auto va = a.to_vector<double>(), vb = b.to_vector<double>(), vg = g.to_vector<double>();
    for (const Derivatives& c : cases) {
      SCOPED_TRACE(std::string(c.name) + " " + shape_str(shapes.a) + " " + shape_str(shapes.b) + " " +
                   dtype_name(dtype_of<T>()));
      const Tensor ad = leaf_on(a, device), bd = leaf_on(b, device);
      c.op(ad, bd).backward(g.to(device));
      std::vector<double> ga(va.size(), 0.0), gb(vb.size(), 0.0), ga_abs(va.size(), 0.0), gb_abs(vb.size(), 0.0);
      for (int64_t i = 0; i < numel(out_shape); ++i) {
        const auto ia = static_cast<size_t>(operand_index(shapes.a, out_shape, i));
        const auto ib = static_cast<size_t>(operand_index(shapes.b, out_shape, i));
        const double gi = vg[static_cast<size_t>(i)];
        const double ta = gi * c.da(va[ia], vb[ib]), tb = gi * c.db(va[ia], vb[ib]);
        ga[ia] += ta;
        gb[ib] += tb;
        ga_abs[ia] += std::abs(ta);
        gb_abs[ib] += std::abs(tb);
      }
      if (numel(out_shape) == 0) continue;
      ASSERT_TRUE(ad.grad().defined());
      ASSERT_TRUE(bd.grad().defined());
      ASSERT_EQ(ad.grad().device(), device);
      const auto got_a = ad.grad().to_vector<double>();
      const auto got_b = bd.grad().to_vector<double>();
      ASSERT_EQ(got_a.size(), ga.size());
      ASSERT_EQ(got_b.size(), gb.size());
      for (size_t k = 0; k < ga.size(); ++k) EXPECT_NEAR(got_a[k], ga[k], eps * (ga_abs[k] + 1e-2)) << "a " << k;
      for (size_t k = 0; k < gb.size(); ++k) EXPECT_NEAR(got_b[k], gb[k], eps * (gb_abs[k] + 1e-2)) << "b " << k;
    }
  }
}

TEST_P(CudaElementwise, BinaryGradientsSumOverTheBroadcastAxes) {
  expect_binary_gradients<float>(GetParam());
  expect_binary_gradients<double>(GetParam());
}

template <typename T>
void expect_scalar_ops_exact(Device device) {
  const Tensor x = random_f64({3, 1029}, 7, -5, 5).to(dtype_of<T>());
  const auto v = x.to_vector<T>();
  struct ScalarCase {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    std::function<T(T)> apply;
  };
  const std::vector<ScalarCase> cases = {
      {"x + 2.5", [](const Tensor& t) { return t + 2.5; }, [](T e) { return e + T(2.5); }},
      {"x - 1.25", [](const Tensor& t) { return t - 1.25; }, [](T e) { return e + T(-1.25); }},
      {"x * -3", [](const Tensor& t) { return t * -3.0; }, [](T e) { return T(-3) * e; }},
      {"x / 4", [](const Tensor& t) { return t / 4.0; }, [](T e) { return T(0.25) * e; }},
      {"-x", [](const Tensor& t) { return -t; }, [](T e) { return -e; }},
  };
  const Tensor g = random_f64(x.shape(), 8).to(dtype_of<T>());
  const auto vg = g.to_vector<T>();
  for (const ScalarCase& c : cases) {
    SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dtype_of<T>()));
    const Tensor xd = leaf_on(x, device);
    const Tensor out = c.op(xd);
    const auto got = out.to_vector<T>();
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(got[i], c.apply(v[i])) << "element " << i;
    // The gradient is alpha · g, and alpha is apply(1) - apply(0).
    out.backward(g.to(device));
    const T alpha = c.apply(T(1)) - c.apply(T(0));
    const auto grad = xd.grad().to_vector<T>();
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(grad[i], alpha * vg[i]) << "element " << i;
  }
}

TEST_P(CudaElementwise, ScalarAddMultiplyAndNegateAreExact) {
  expect_scalar_ops_exact<float>(GetParam());
  expect_scalar_ops_exact<double>(GetParam());
}

// Each activation with its input range, float64 value and derivative.
struct UnaryCase {
  const char* name;
  Tensor (*op)(const Tensor&);
  double low, high;
  double (*value)(double);
  double (*derivative)(double);
};

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double normal_pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"relu", [](const Tensor& x) { return relu(x); }, -2, 2, [](double x) { return x < 0 ? 0.0 : x; },
       [](double x) { return x > 0 ? 1.0 : 0.0; }},
      {"gelu", [](const Tensor& x) { return gelu(x); }, -7, 7, [](double x) { return x * normal_cdf(x); },
       [](double x) { return normal_cdf(x) + x * normal_pdf(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }, -5, 5, [](double x) { return std::tanh(x); },
       [](double x) { return 1 - std::tanh(x) * std::tanh(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }, -20, 20, [](double x) { return std::exp(x); },
       [](double x) { return std::exp(x); }},
      {"log", [](const Tensor& x) { return log(x); }, 0.01, 10, [](double x) { return std::log(x); },
       [](double x) { return 1 / x; }},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.01, 10, [](double x) { return std::sqrt(x); },
       [](double x) { return 0.5 / std::sqrt(x); }},
      {"square", [](const Tensor& x) { return square(x); }, -3, 3, [](double x) { return x * x; },
       [](double x) { return 2 * x; }},
  };
  return cases;
}

template <typename T>
void expect_unary_ops_close(Device device) {
  // f32: the kernels' functions are within a few ulp; 1 - y² (tanh) and the sums in gelu's
  // derivative lose a little more in absolute terms.
  const double rtol = reference_rtol(dtype_of<T>());
  const double atol = std::is_same_v<T, float> ? 2e-6 : 1e-13;
  uint64_t seed = 200;
  for (const UnaryCase& c : unary_cases()) {
    SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dtype_of<T>()));
    const Tensor x = random_f64({3, 1031}, seed++, c.low, c.high).to(dtype_of<T>());
    const Tensor g = random_f64(x.shape(), seed++).to(dtype_of<T>());
    const auto vx = x.to_vector<double>(), vg = g.to_vector<double>();
    std::vector<double> value, grad;
    for (size_t i = 0; i < vx.size(); ++i) {
      value.push_back(c.value(vx[i]));
      grad.push_back(vg[i] * c.derivative(vx[i]));
    }
    const Tensor xd = leaf_on(x, device);
    const Tensor out = c.op(xd);
    ASSERT_EQ(out.device(), device);
    testing::expect_all_close(out.to(Device::cpu()), value, rtol, atol);
    out.backward(g.to(device));
    testing::expect_all_close(xd.grad().to(Device::cpu()), grad, rtol, atol);
  }
}

TEST_P(CudaElementwise, ActivationsAndTheirGradientsMatchFloat64) {
  expect_unary_ops_close<float>(GetParam());
  expect_unary_ops_close<double>(GetParam());
}

TEST_P(CudaElementwise, StridedInputsAndEmptyTensors) {
  const Device device = GetParam();
  // A transposed view is read in its own element order.
  const Tensor x = random_f64({37, 53}, 300, -3, 3);
  const auto vx = x.to_vector<double>();
  const auto got = gelu(transpose(x.to(device), 0, 1)).to_vector<double>();
  ASSERT_EQ(got.size(), vx.size());
  for (int64_t i = 0; i < 53; ++i)
    for (int64_t j = 0; j < 37; ++j) {
      const double v = vx[static_cast<size_t>(j * 53 + i)];
      EXPECT_NEAR(got[static_cast<size_t>(i * 37 + j)], v * normal_cdf(v), 1e-13) << i << ", " << j;
    }
  // Empty tensors go through every kind of op.
  const Tensor empty = Tensor::empty({0, 5}, DType::f32, device);
  EXPECT_EQ(exp(empty).shape(), (Shape{0, 5}));
  EXPECT_EQ((empty * 2.0).shape(), (Shape{0, 5}));
  EXPECT_EQ((empty + Tensor::ones({5}, DType::f32, device)).shape(), (Shape{0, 5}));
}

TEST_P(CudaElementwise, NanAndInfinityPassThroughLikeTheCpu) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = Tensor::from_vector<float>({nan, inf, -inf, 0.0f, -1.0f}, {5}, GetParam());
  const auto r = relu(x).to_vector<float>();
  EXPECT_TRUE(std::isnan(r[0]));
  EXPECT_EQ(r[1], inf);
  EXPECT_EQ(r[2], 0.0f);
  const auto e = exp(x).to_vector<float>();
  EXPECT_TRUE(std::isnan(e[0]));
  EXPECT_EQ(e[1], inf);
  EXPECT_EQ(e[2], 0.0f);
  EXPECT_EQ(e[3], 1.0f);
  const auto t = tanh(x).to_vector<float>();
  EXPECT_EQ(t[1], 1.0f);
  EXPECT_EQ(t[2], -1.0f);
  const auto l = log(x).to_vector<float>();
  EXPECT_EQ(l[3], -inf);
  EXPECT_TRUE(std::isnan(l[4]));
  const auto g = gelu(x).to_vector<float>();
  EXPECT_EQ(g[1], inf);
  EXPECT_EQ(g[3], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaElementwise, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
