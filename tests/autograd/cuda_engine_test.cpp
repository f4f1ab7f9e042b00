// Backward on each test device: the engine sums the gradients that reach one tensor from
// several consumers, and adds each backward's result into a leaf's .grad, on the tensors'
// own device. Probe nodes (which return fixed gradients) test the sums exactly, with copies
// as the only other device work; a small network of real ops is compared with a float64
// hand-derived gradient and with the CPU's backward.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "lockstep/autograd/node.h"
#include "lockstep/ops/ops.h"
#include "testing/device_tensors.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::copy_to;
using testing::leaf_on;
using testing::random_f64;

// Not a multiple of any block size, and more than one block of elements.
const Shape kShape{3, 347};

// An op whose output is a copy of its first input and whose backward returns the given
// gradients (one per input, on the inputs' device) whatever it receives; what it receives
// is kept, on the host, in *received.
Tensor probe(const std::vector<Tensor>& inputs, std::vector<Tensor> gradients,
             std::shared_ptr<std::vector<Tensor>> received) {
  const Tensor out = copy_to(inputs[0], inputs[0].dtype(), inputs[0].device());
  autograd::record("Probe", inputs, {out},
                   [gradients = std::move(gradients), received](const std::vector<Tensor>& grad_outputs) {
                     received->push_back(copy_to(grad_outputs[0], grad_outputs[0].dtype(), Device::cpu()));
                     return gradients;
                   });
  return out;
}

// a + b in the element type, on the host: the exact result of one addition.
std::vector<double> add_in(DType dtype, const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    out[i] =
        dtype == DType::f32 ? static_cast<double>(static_cast<float>(a[i]) + static_cast<float>(b[i])) : a[i] + b[i];
  return out;
}

class CudaEngine : public testing::DeviceTest {};

TEST_P(CudaEngine, SumsGradientsFromSeveralConsumersAndIntoLeafGrad) {
  const Device device = GetParam();
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    // Host values of the gradients each probe returns, already rounded to dtype.
    auto host = [&](uint64_t seed) { return copy_to(random_f64(kShape, seed), dtype, Device::cpu()); };
    const Tensor ga = host(1), gb1 = host(2), gb2 = host(3), gc = host(4);
    const Tensor s1 = host(5), s2 = host(6), s3 = host(7);
    auto on_device = [&](const Tensor& t) { return copy_to(t, dtype, device); };

    Tensor x = copy_to(random_f64(kShape, 8), dtype, device);
    x.set_requires_grad(true);
    auto received_a = std::make_shared<std::vector<Tensor>>();
    auto received_root = std::make_shared<std::vector<Tensor>>();
    auto unused = std::make_shared<std::vector<Tensor>>();

    // x -> a -> {b1, b2}; x -> c; {b1, b2, c} -> root. a gets b1's and b2's gradients summed
    // in a buffer, x gets a's and c's, and x.grad takes the sum of both backward passes.
    auto backward_once = [&]() {
      const Tensor a = probe({x}, {on_device(ga)}, received_a);
      const Tensor b1 = probe({a}, {on_device(gb1)}, unused);
      const Tensor b2 = probe({a}, {on_device(gb2)}, unused);
      const Tensor c = probe({x}, {on_device(gc)}, unused);
      const Tensor root = probe({b1, b2, c}, {on_device(s1), on_device(s2), on_device(s3)}, received_root);
      ASSERT_EQ(root.device(), device);
      root.backward(Tensor::ones(kShape, dtype, device));
    };
    backward_once();
    ASSERT_EQ(received_root->size(), 1u);
    testing::expect_all_close(received_root->at(0), std::vector<double>(static_cast<size_t>(x.numel()), 1.0), 0, 0);
    ASSERT_EQ(received_a->size(), 1u);
    testing::expect_all_close(received_a->at(0), add_in(dtype, gb1.to_vector<double>(), gb2.to_vector<double>()), 0, 0);
    const std::vector<double> once = add_in(dtype, ga.to_vector<double>(), gc.to_vector<double>());
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().device(), device);
    EXPECT_EQ(x.grad().dtype(), dtype);
    testing::expect_all_close(x.grad(), once, 0, 0);

    backward_once();
    ASSERT_EQ(received_a->size(), 2u);
    testing::expect_all_close(received_a->at(1), add_in(dtype, gb1.to_vector<double>(), gb2.to_vector<double>()), 0, 0);
    testing::expect_all_close(x.grad(), add_in(dtype, once, once), 0, 0);
  }
}

// loss = sum(y * y + y) + sum(x * 0.5), y = tanh(x @ w + b): x reaches the loss along two
// paths and y along three.
Tensor small_network(const Tensor& x, const Tensor& w, const Tensor& b) {
  const Tensor y = tanh(matmul(x, w) + b);
  return sum(y * y + y) + sum(x * 0.5);
}

struct Gradients {
  std::vector<double> x, w, b;
};

// The same gradients derived by hand, in double: dL/dh = (2y + 1)(1 - y²).
Gradients reference_gradients(const Tensor& x_values, const Tensor& w_values, const Tensor& b_values) {
  const int64_t n = x_values.size(0), k = x_values.size(1), m = w_values.size(1);
  const auto x = x_values.to_vector<double>(), w = w_values.to_vector<double>(), b = b_values.to_vector<double>();
  std::vector<double> dh(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double h = b[static_cast<size_t>(j)];
      for (int64_t l = 0; l < k; ++l) h += x[static_cast<size_t>(i * k + l)] * w[static_cast<size_t>(l * m + j)];
      const double y = std::tanh(h);
      dh[static_cast<size_t>(i * m + j)] = (2 * y + 1) * (1 - y * y);
    }
  Gradients g{std::vector<double>(x.size(), 0.5), std::vector<double>(w.size(), 0.0),
              std::vector<double>(b.size(), 0.0)};
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      const double d = dh[static_cast<size_t>(i * m + j)];
      g.b[static_cast<size_t>(j)] += d;
      for (int64_t l = 0; l < k; ++l) {
        g.x[static_cast<size_t>(i * k + l)] += d * w[static_cast<size_t>(l * m + j)];
        g.w[static_cast<size_t>(l * m + j)] += x[static_cast<size_t>(i * k + l)] * d;
      }
    }
  return g;
}

TEST_P(CudaEngine, BackwardThroughASmallNetworkMatchesFloat64AndTheCpu) {
  const Device device = GetParam();
  const Tensor x_values = random_f64({5, 301}, 11);
  const Tensor w_values = random_f64({301, 70}, 12, -0.05, 0.05);
  const Tensor b_values = random_f64({70}, 13);
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    // The reference sees the inputs as rounded to dtype.
    const Gradients expected =
        reference_gradients(copy_to(x_values, dtype, Device::cpu()), copy_to(w_values, dtype, Device::cpu()),
                            copy_to(b_values, dtype, Device::cpu()));
    auto leaf = [&](const Tensor& values, Device where) { return leaf_on(values.to(dtype), where); };
    const Tensor x = leaf(x_values, device), w = leaf(w_values, device), b = leaf(b_values, device);
    const Tensor cpu_x = leaf(x_values, Device::cpu()), cpu_w = leaf(w_values, Device::cpu()),
                 cpu_b = leaf(b_values, Device::cpu());
    small_network(x, w, b).backward();
    small_network(cpu_x, cpu_w, cpu_b).backward();
    const double reference_tolerance = dtype == DType::f32 ? 1e-4 : 1e-11;
    const double cpu_tolerance = dtype == DType::f32 ? 1e-5 : 1e-12;
    for (const auto& [grad, cpu_grad, reference] :
         {std::tuple{x.grad(), cpu_x.grad(), &expected.x}, std::tuple{w.grad(), cpu_w.grad(), &expected.w},
          std::tuple{b.grad(), cpu_b.grad(), &expected.b}}) {
      ASSERT_TRUE(grad.defined());
      EXPECT_EQ(grad.device(), device);
      const Tensor host_grad = grad.to(Device::cpu());
      testing::expect_all_close(host_grad, *reference, reference_tolerance, reference_tolerance);
      testing::expect_all_close(host_grad, cpu_grad, cpu_tolerance, cpu_tolerance);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaEngine, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
