#include "lockstep/ops/elementwise.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "lockstep/core/parallel.h"
#include "lockstep/ops/reduce.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::expect_all_close;
using testing::expect_gradients_match;
using testing::random_f64;

// NumPy broadcasting written out independently: out[i] = f(a[ia], b[ib]) with each
// operand's index found from the output coordinates (size-1 and missing axes read index 0).
std::vector<double> naive_binary(const Tensor& a, const Tensor& b, const std::function<double(double, double)>& f,
                                 Shape* out_shape) {
  const size_t rank = std::max(a.shape().size(), b.shape().size());
  auto padded = [rank](const Shape& s) {
    Shape p(rank - s.size(), 1);
    p.insert(p.end(), s.begin(), s.end());
    return p;
  };
  const Shape pa = padded(a.shape()), pb = padded(b.shape());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) out[i] = pa[i] == 1 ? pb[i] : pa[i];
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  int64_t total = 1;
  for (int64_t d : out) total *= d;
  std::vector<double> result;
  for (int64_t flat = 0; flat < total; ++flat) {
    int64_t rest = flat, ia = 0, ib = 0, stride_a = 1, stride_b = 1;
    for (size_t i = rank; i-- > 0;) {
      const int64_t coord = rest % out[i];
      rest /= out[i];
      ia += (pa[i] == 1 ? 0 : coord) * stride_a;
      ib += (pb[i] == 1 ? 0 : coord) * stride_b;
      stride_a *= pa[i];
      stride_b *= pb[i];
    }
    result.push_back(f(va[static_cast<size_t>(ia)], vb[static_cast<size_t>(ib)]));
  }
  *out_shape = out;
  return result;
}

struct BinaryCase {
  const char* name;
  Tensor (*op)(const Tensor&, const Tensor&);
  std::function<double(double, double)> reference;
};

const std::vector<BinaryCase>& binary_cases() {
  static const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, [](double x, double y) { return x + y; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, [](double x, double y) { return x - y; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, [](double x, double y) { return x * y; }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, [](double x, double y) { return x / y; }},
  };
  return cases;
}

void expect_binary_matches(const Tensor& a, const Tensor& b) {
  for (const BinaryCase& c : binary_cases()) {
    SCOPED_TRACE(std::string(c.name) + " " + shape_str(a.shape()) + " " + shape_str(b.shape()) + " " +
                 dtype_name(a.dtype()));
    Shape shape;
    const auto expected = naive_binary(a, b, c.reference, &shape);
    const Tensor out = c.op(a, b);
    ASSERT_EQ(out.shape(), shape);
    EXPECT_TRUE(out.is_contiguous());
    // The reference runs in double on the same inputs: f32 results are within an ulp.
    const double rtol = a.dtype() == DType::f32 ? 2e-7 : 1e-15;
    expect_all_close(out, expected, rtol, 0.0);
  }
}

TEST(Elementwise, BinaryOpsBroadcastLikeNumpy) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{2, 3, 4}, {2, 3, 4}},
      {{5, 7}, {7}},
      {{5, 7}, {5, 1}},
      {{4, 1, 3}, {1, 5, 1}},
      {{3}, {2, 1, 1}},
      {{}, {3, 2}},
      {{2, 3}, {}},
      {{6, 1, 4, 1}, {5, 1, 3}},
      {{1, 1}, {1}},
      {{0, 3}, {3}},
      {{2, 1, 3, 1}, {2, 5, 1, 4}},
  };
  uint64_t seed = 1;
  for (const auto& [sa, sb] : shapes) {
    for (DType dtype : {DType::f32, DType::f64}) {
      // b stays away from 0 so div is well conditioned.
      const Tensor a = random_f64(sa, seed++).to(dtype);
      const Tensor b = random_f64(sb, seed++, 0.5, 2.0).to(dtype);
      expect_binary_matches(a, b);
      expect_binary_matches(b, a);
    }
  }
}

TEST(Elementwise, LargeBroadcastsSplitAcrossThreadsMatchNaive) {
  // Large enough for several parallel chunks whose boundaries fall inside rows.
  const int previous = num_threads();
  set_num_threads(3);
  const Tensor x = random_f64({301, 257}, 11).to(DType::f32);
  const Tensor bias = random_f64({257}, 12, 0.5, 2.0).to(DType::f32);
  const Tensor column = random_f64({301, 1}, 13, 0.5, 2.0).to(DType::f32);
  expect_binary_matches(x, bias);
  expect_binary_matches(bias, x);
  expect_binary_matches(x, column);
  expect_binary_matches(column, bias);  // outer product shape [301, 257]
  expect_binary_matches(x, x);
  set_num_threads(previous);
}

TEST(Elementwise, StridedInputs) {
  // a: the transpose of a [4, 3] buffer; b: every other element of an [8] buffer.
  const Tensor base = random_f64({4, 3}, 21);
  const Tensor a = base.as_strided({3, 4}, {1, 3}, 0);
  const Tensor b = random_f64({8}, 22, 0.5, 2.0).as_strided({4}, {2}, 1);
  ASSERT_FALSE(a.is_contiguous());
  ASSERT_FALSE(b.is_contiguous());
  expect_binary_matches(a, b);
  expect_binary_matches(b, a);
  expect_binary_matches(a.to(DType::f32), b.to(DType::f32));
  // A broadcast view (stride 0) as an input.
  const Tensor expanded = random_f64({3}, 23).as_strided({4, 3}, {0, 1}, 0);
  expect_binary_matches(expanded, a.as_strided({4, 3}, {1, 4}, 0));
}

TEST(Elementwise, ScalarOperandsAndOperators) {
  const Tensor x = Tensor::from_vector<float>({-2, -0.5, 0, 1.5}, {2, 2});
  expect_all_close(add(x, 2.5), {0.5, 2, 2.5, 4});
  expect_all_close(mul(x, -3.0), {6, 1.5, 0, -4.5});
  expect_all_close(neg(x), {2, 0.5, 0, -1.5});
  expect_all_close(x - 1.0, {-3, -1.5, -1, 0.5});
  expect_all_close(2.0 * x, {-4, -1, 0, 3});
  expect_all_close(x / 4.0, {-0.5, -0.125, 0, 0.375});
  expect_all_close(-x + x * x, {6, 0.75, 0, 0.75});
  EXPECT_TRUE(std::signbit(neg(Tensor::zeros({1})).item()));  // -0, as PyTorch
}

double round_to_f32(double v) {
  constexpr double kOverflow = 3.4028235677973366e38;  // FLT_MAX plus half its ulp: rounds to inf
  if (std::abs(v) >= kOverflow) return std::copysign(std::numeric_limits<double>::infinity(), v);
  return static_cast<double>(static_cast<float>(v));
}

// f(x) for x spread over [low, high], plus special values, against a double reference.
void expect_unary_matches(Tensor (*op)(const Tensor&), double (*reference)(double), double low, double high,
                          double rtol_f32, std::vector<double> extra = {}, double rtol_f64 = 1e-15) {
  std::vector<double> values = std::move(extra);
  for (int i = 0; i <= 2000; ++i) values.push_back(low + (high - low) * i / 2000.0);
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = Tensor::from_vector(values, {static_cast<int64_t>(values.size())}).to(dtype);
    const auto inputs = x.to_vector<double>();  // as rounded to the dtype
    const auto out = op(x).to_vector<double>();
    const double rtol = dtype == DType::f32 ? rtol_f32 : rtol_f64;
    for (size_t i = 0; i < inputs.size(); ++i) {
      // In f32 the best possible answer is the exact one rounded to f32 (inf past its range).
      const double exact = reference(inputs[i]);
      const double want = dtype == DType::f32 ? round_to_f32(exact) : exact;
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(out[i])) << "x = " << inputs[i] << " gave " << out[i];
      } else if (std::isinf(want)) {
        EXPECT_EQ(out[i], want) << "x = " << inputs[i];
      } else {
        // The atol admits f32 subnormals (flushed or rounded) and nothing more.
        EXPECT_NEAR(out[i], want, rtol * std::abs(want) + 2e-38) << "x = " << inputs[i];
      }
    }
  }
}

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(Elementwise, ExpMatchesLibmOverTheFloatRange) {
  expect_unary_matches(exp, [](double v) { return std::exp(v); }, -110, 95, 3e-7,
                       {kInf, -kInf, kNaN, 0, -0.0, 1e-8, -87.3, -103, 88.72, 88.7228, 88.73});
}

TEST(Elementwise, TanhMatchesLibm) {
  expect_unary_matches(tanh, [](double v) { return std::tanh(v); }, -12, 12, 3e-7,
                       {kInf, -kInf, kNaN, 0, 1e-30, -1e-7, 3e-3, 0.39999, 0.40001, -0.4, 1e4});
}

TEST(Elementwise, GeluIsTheExactErfForm) {
  // x·Phi(x) = x/2 · erfc(-x/√2); accurate in relative terms far into the negative tail
  // (erfc magnifies the rounding of -x/√2 by 2z², hence the looser f64 tolerance there).
  auto reference = [](double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); };
  expect_unary_matches(gelu, reference, -6, 6, 1e-6, {kInf, kNaN, 0, 1e-30, -1e-6, 40}, 1e-14);
  expect_unary_matches(gelu, reference, -13, -6, 1e-6, {-14, -15, -100}, 1e-13);
  expect_all_close(gelu(Tensor::from_vector<double>({-1, 0, 1}, {3})), {-0.15865525393145707, 0, 0.8413447460685429},
                   1e-15);
}

// The float activations run as SIMD loops whose leftover elements (and chunks too short for
// a vector) take the scalar code: both must give every element the same bits, or a result
// would depend on where a thread's share of the tensor begins, so on the thread count.
// Each element computed alone (the scalar code) against it within one long tensor.
TEST(Elementwise, VectorLoopsGiveEachElementsOwnBits) {
  constexpr int64_t n = 4099;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-20.0f, 20.0f);
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    values[static_cast<size_t>(i)] = i % 3 == 0 ? std::bit_cast<float>(bits) : wide(rng);
  }
  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&);
  };
  const Case cases[] = {{"gelu", [](const Tensor& x) { return gelu(x); }},
                        {"tanh", [](const Tensor& x) { return tanh(x); }},
                        {"exp", [](const Tensor& x) { return exp(x); }}};
  const Tensor ones = Tensor::ones({n});
  const auto same = [](float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x = Tensor::from_vector(values, {n}).set_requires_grad(true);
    const Tensor y = c.op(x);
    y.backward(ones);
    const auto together = y.to_vector<float>(), gradients = x.grad().to_vector<float>();
    int64_t differing = 0;
    for (int64_t i = 0; i < n; ++i) {
      Tensor one = Tensor::from_vector(std::vector<float>{values[static_cast<size_t>(i)]}, {1}).set_requires_grad(true);
      const Tensor alone = c.op(one);
      alone.backward(Tensor::ones({1}));
      if (!same(alone.to_vector<float>()[0], together[static_cast<size_t>(i)]) ||
          !same(one.grad().to_vector<float>()[0], gradients[static_cast<size_t>(i)])) {
        if (++differing <= 3) ADD_FAILURE() << "element " << i << " (" << values[static_cast<size_t>(i)] << ")";
      }
    }
    EXPECT_EQ(differing, 0);
  }
}

TEST(Elementwise, ReluLogSqrtSquareFollowIeee) {
  expect_unary_matches(relu, [](double v) { return v < 0 ? 0.0 : v; }, -3, 3, 0, {0, -0.0, kNaN, kInf, -kInf});
  // log of 0 is -inf and of a negative number nan, as in PyTorch: no error.
  expect_unary_matches(log, [](double v) { return std::log(v); }, 1e-3, 50, 1e-7, {0, -1, kInf, kNaN, 1e-30});
  expect_unary_matches(sqrt, [](double v) { return std::sqrt(v); }, 0, 50, 1e-7, {-1, kInf, kNaN});
  expect_unary_matches(square, [](double v) { return v * v; }, -4, 4, 1e-7, {kInf, kNaN});
}

TEST(Elementwise, UnaryOpsAcceptStridedInputs) {
  const Tensor base = random_f64({5, 6}, 31);
  const Tensor view = base.as_strided({3, 5}, {2, 6}, 1);  // base[:, 1::2] transposed
  const auto values = view.to_vector<double>();
  std::vector<double> expected;
  for (double v : values) expected.push_back(std::tanh(v));
  expect_all_close(tanh(view), expected, 1e-15);
  expect_all_close(tanh(view.to(DType::f32)), expected, 3e-7);
}

TEST(Elementwise, BinaryGradientsReduceBroadcastAxes) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{2, 3, 4}, {3, 1}}, {{3}, {2, 3}}, {{2, 3}, {2, 3}}, {{4, 1}, {1, 5}}, {{}, {2, 2}}};
  uint64_t seed = 100;
  for (const auto& [sa, sb] : shapes) {
    for (const BinaryCase& c : binary_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + shape_str(sa) + " " + shape_str(sb));
      Tensor a = random_f64(sa, seed++).set_requires_grad(true);
      Tensor b = random_f64(sb, seed++, 0.5, 2.0).set_requires_grad(true);
      auto op = c.op;
      expect_gradients_match([op](const std::vector<Tensor>& in) { return op(in[0], in[1]); }, {a, b});
    }
  }
}

TEST(Elementwise, GradientFlowsToOnlyTheOperandThatNeedsIt) {
  Tensor a = random_f64({2, 3}, 41).set_requires_grad(true);
  const Tensor b = random_f64({3}, 42, 0.5, 2.0);
  expect_gradients_match([&b](const std::vector<Tensor>& in) { return div(in[0], b); }, {a});
  EXPECT_FALSE(b.grad().defined());
  // The same tensor on both sides gets both contributions: d(x·x)/dx = 2x.
  Tensor x = Tensor::from_vector<double>({1, -2, 3}, {3}).set_requires_grad(true);
  sum(mul(x, x)).backward();
  expect_all_close(x.grad(), {2, -4, 6});
}

TEST(Elementwise, UnaryAndScalarGradients) {
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    double low, high;
  };
  const std::vector<Case> cases = {
      {"relu", [](const Tensor& x) { return relu(x); }, -1, 1},
      {"gelu", [](const Tensor& x) { return gelu(x); }, -3, 3},
      {"tanh", [](const Tensor& x) { return tanh(x); }, -2, 2},
      {"exp", [](const Tensor& x) { return exp(x); }, -2, 2},
      {"log", [](const Tensor& x) { return log(x); }, 0.2, 3},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.2, 3},
      {"square", [](const Tensor& x) { return square(x); }, -2, 2},
      {"neg", [](const Tensor& x) { return neg(x); }, -2, 2},
      {"add scalar", [](const Tensor& x) { return x + 1.5; }, -2, 2},
      {"mul scalar", [](const Tensor& x) { return x * -2.5; }, -2, 2},
      {"div scalar", [](const Tensor& x) { return x / 4.0; }, -2, 2},
  };
  uint64_t seed = 200;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x = random_f64({3, 4}, seed++, c.low, c.high).set_requires_grad(true);
    auto op = c.op;
    expect_gradients_match([op](const std::vector<Tensor>& in) { return op(in[0]); }, {x});
  }
}

TEST(Elementwise, ReluGradientIsZeroAtZero) {
  Tensor x = Tensor::from_vector<float>({-1, 0, 2, -0.0f}, {4}).set_requires_grad(true);
  sum(relu(x)).backward();
  expect_all_close(x.grad(), {0, 0, 1, 0}, 0, 0);
}

TEST(Elementwise, StridedLeafGetsTheGradientOfItsDenseCopy) {
  const Tensor base = random_f64({4, 3}, 51);
  Tensor strided = base.as_strided({3, 4}, {1, 3}, 0).set_requires_grad(true);
  Tensor dense = Tensor::empty({3, 4}, DType::f64);
  dense.copy_from(strided);
  dense.set_requires_grad(true);
  const Tensor w = random_f64({4}, 52);
  sum(gelu(strided) * w).backward();
  sum(gelu(dense) * w).backward();
  ASSERT_EQ(strided.grad().shape(), (Shape{3, 4}));
  expect_all_close(strided.grad(), dense.grad(), 0, 0);
}

TEST(Elementwise, ErrorsNameTheProblem) {
  const Tensor a = Tensor::zeros({2, 3});
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string shapes = message([&] { add(a, Tensor::zeros({4})); });
  EXPECT_NE(shapes.find("add"), std::string::npos) << shapes;
  EXPECT_NE(shapes.find("[2, 3]"), std::string::npos) << shapes;
  EXPECT_NE(shapes.find("[4]"), std::string::npos) << shapes;
  const std::string dtypes = message([&] { mul(a, Tensor::zeros({2, 3}, DType::f64)); });
  EXPECT_NE(dtypes.find("f32"), std::string::npos) << dtypes;
  EXPECT_NE(dtypes.find("f64"), std::string::npos) << dtypes;
  EXPECT_THROW(relu(Tensor::zeros({2}, DType::i64)), Error);
  EXPECT_THROW(add(Tensor::zeros({2}, DType::i32), Tensor::zeros({2}, DType::i32)), Error);
  EXPECT_THROW(sub(Tensor::zeros({2, 3}), Tensor::zeros({3, 2})), Error);
  EXPECT_THROW(add(a, Tensor::zeros({3}, DType::f32, Device::cpu(1))), Error);
}

}  // namespace
}  // namespace lockstep
