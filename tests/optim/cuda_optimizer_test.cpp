// SGD, AdamW and gradient clipping on each test device: against float64 transcriptions of
// PyTorch's update rules, and against the same optimizer run on the CPU (the GPU kernels
// repeat the CPU loops' operations in the same order, so the two agree to rounding).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "lockstep/ops/ops.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/optim/clip_grad_norm.h"
#include "lockstep/optim/sgd.h"
#include "testing/device_tensors.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"
#include "testing/reference_optimizers.h"

namespace lockstep::optim {
namespace {

using testing::copy_to;
using testing::leaf_on;
using testing::random_f64;
using testing::reference_rtol;
using testing::ReferenceAdamW;
using testing::ReferenceSGD;

// Not a multiple of any block size, and larger than one block's worth of elements.
const Shape kShape{37, 1031};

// A parameter on device holding values' elements in dtype, in storage of its own.
Tensor make_param(const Tensor& values, DType dtype, Device device) { return leaf_on(values.to(dtype), device); }

// The tolerance against the CPU run of the same code (reference_rtol is the one against the
// float64 reference).
double cpu_tolerance(DType dtype) { return dtype == DType::f32 ? 1e-6 : 1e-14; }

class CudaOptimizer : public testing::DeviceTest {};

// `steps` steps of Optim on one parameter of kShape (values from `seed`) on device, of Optim on
// the CPU and of the float64 Reference side by side, on the same gradients (uniform in
// ±grad_range, from grad_seed on, rounded to dtype); checks the parameter against both, then
// hands the device's optimizer and the reference to check_state.
template <typename Optim, typename Reference, typename Options, typename CheckState>
void step_beside_cpu_and_reference(Device device, const Options& options, DType dtype, int steps, uint64_t seed,
                                   uint64_t grad_seed, double grad_range, CheckState check_state) {
  const Tensor initial = random_f64(kShape, seed);
  Tensor param = make_param(initial, dtype, device);
  Tensor cpu_param = make_param(initial, dtype, Device::cpu());
  std::vector<double> expected = copy_to(initial, dtype, Device::cpu()).to_vector<double>();
  Optim optimizer({param}, options);
  Optim cpu_optimizer({cpu_param}, options);
  Reference reference(options);
  for (int s = 0; s < steps; ++s) {
    const Tensor grad = copy_to(random_f64(kShape, grad_seed + static_cast<uint64_t>(s), -grad_range, grad_range),
                                dtype, Device::cpu());
    param.set_grad(copy_to(grad, dtype, device));
    cpu_param.set_grad(grad);
    optimizer.step();
    cpu_optimizer.step();
    reference.step(expected, grad.to_vector<double>());
  }
  EXPECT_EQ(param.device(), device);
  const Tensor result = param.to(Device::cpu());
  testing::expect_all_close(result, expected, reference_rtol(dtype), reference_rtol(dtype));
  testing::expect_all_close(result, cpu_param, cpu_tolerance(dtype), cpu_tolerance(dtype));
  check_state(optimizer, reference);
}

void check_sgd(Device device, const SGDOptions& options, DType dtype, int steps = 5) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " momentum " << options.momentum << " dampening "
                                    << options.dampening << " weight_decay " << options.weight_decay << " nesterov "
                                    << options.nesterov);
  step_beside_cpu_and_reference<SGD, ReferenceSGD>(
      device, options, dtype, steps, 1, 100, 1.0, [&](const SGD& sgd, const ReferenceSGD& reference) {
        if (options.momentum == 0) return;
        const Tensor& buffer = sgd.state(0, 0);
        ASSERT_TRUE(buffer.defined());
        EXPECT_EQ(buffer.device(), device) << "the momentum buffer lives beside its parameter";
        testing::expect_all_close(buffer.to(Device::cpu()), reference.buf, reference_rtol(dtype),
                                  reference_rtol(dtype));
      });
}

TEST_P(CudaOptimizer, SgdMatchesReferenceAndCpu) {
  const std::vector<SGDOptions> cases = {
      {.lr = 0.1},
      {.lr = 0.1, .weight_decay = 0.1},
      {.lr = 0.1, .momentum = 0.9},
      {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
      {.lr = 0.05, .momentum = 0.8, .weight_decay = 0.02, .nesterov = true},
  };
  for (const SGDOptions& options : cases) {
    check_sgd(GetParam(), options, DType::f32);
    check_sgd(GetParam(), options, DType::f64);
  }
}

TEST_P(CudaOptimizer, SgdSkipsParametersWithoutGradient) {
  const Tensor initial = random_f64({3, 5}, 7);
  Tensor with_grad = make_param(initial, DType::f32, GetParam());
  Tensor without = make_param(initial, DType::f32, GetParam());
  SGD sgd({with_grad, without}, {.lr = 0.5, .momentum = 0.9});
  with_grad.set_grad(Tensor::ones({3, 5}, DType::f32, GetParam()));
  sgd.step();
  EXPECT_TRUE(sgd.state(0, 0).defined());
  EXPECT_FALSE(sgd.state(1, 0).defined());
  const std::vector<double> initial_f32 = copy_to(initial, DType::f32, Device::cpu()).to_vector<double>();
  testing::expect_all_close(without.to(Device::cpu()), initial_f32, 0, 0);
  std::vector<double> expected = initial_f32;
  for (double& v : expected) v -= 0.5;
  testing::expect_all_close(with_grad.to(Device::cpu()), expected, 1e-6, 1e-6);
}

void check_adamw(Device device, const AdamWOptions& options, DType dtype, int steps = 6) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " lr " << options.lr << " beta1 " << options.beta1
                                    << " weight_decay " << options.weight_decay);
  step_beside_cpu_and_reference<AdamW, ReferenceAdamW>(
      device, options, dtype, steps, 3, 200, 2.0, [&](const AdamW& adamw, const ReferenceAdamW& reference) {
        // The step counter is read by the host every step: it stays in host memory.
        const Tensor& step = adamw.state(0, 0);
        EXPECT_TRUE(step.device().is_cpu()) << step.device();
        EXPECT_EQ(step.item(), steps);
        EXPECT_EQ(adamw.state(0, 1).device(), device);
        EXPECT_EQ(adamw.state(0, 2).device(), device);
        testing::expect_all_close(adamw.state(0, 1).to(Device::cpu()), reference.m, reference_rtol(dtype),
                                  reference_rtol(dtype));
        testing::expect_all_close(adamw.state(0, 2).to(Device::cpu()), reference.v, reference_rtol(dtype),
                                  reference_rtol(dtype));
      });
}

TEST_P(CudaOptimizer, AdamWMatchesReferenceAndCpu) {
  const std::vector<AdamWOptions> cases = {
      {},
      {.lr = 0.05, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1},
      // 1 - beta1 >= 0.5 takes ATen's other lerp formula.
      {.lr = 0.01, .beta1 = 0.3, .beta2 = 0.9, .weight_decay = 0.0},
  };
  for (const AdamWOptions& options : cases) {
    check_adamw(GetParam(), options, DType::f32);
    check_adamw(GetParam(), options, DType::f64);
  }
}

TEST_P(CudaOptimizer, AdamWResumesFromAStateDictCopiedToTheHost) {
  const Device device = GetParam();
  const Shape shape{129, 3};
  const Tensor initial = random_f64(shape, 5);
  const AdamWOptions options{.lr = 0.02, .weight_decay = 0.05};
  auto grad_at = [&](int s) { return copy_to(random_f64(shape, 300 + static_cast<uint64_t>(s)), DType::f32, device); };

  Tensor param = make_param(initial, DType::f32, device);
  AdamW adamw({param}, options);
  for (int s = 0; s < 3; ++s) {
    param.set_grad(grad_at(s));
    adamw.step();
  }
  // What a checkpoint holds: host copies of the state and of the weights.
  NamedTensors saved;
  for (const auto& [key, value] : adamw.state_dict())
    saved.emplace_back(key, copy_to(value, value.dtype(), Device::cpu()));
  Tensor resumed_param = make_param(param.to(Device::cpu()), DType::f32, device);
  AdamW resumed({resumed_param}, options);
  resumed.load_state_dict(saved);
  EXPECT_EQ(resumed.step_count(), 3);
  EXPECT_TRUE(resumed.state(0, 0).device().is_cpu());
  EXPECT_EQ(resumed.state(0, 1).device(), device);

  for (int s = 3; s < 5; ++s) {
    param.set_grad(grad_at(s));
    resumed_param.set_grad(grad_at(s));
    adamw.step();
    resumed.step();
  }
  // The same kernels on the same state: the same bits.
  testing::expect_all_close(resumed_param.to(Device::cpu()), param.to(Device::cpu()), 0, 0);
}

// ---- gradient clipping ----

// Parameters of odd sizes (one past many blocks, one of a single block, one element, and
// none) on device, with random gradients in dtype; one more parameter has no gradient.
std::vector<Tensor> clipping_params(Device device, DType dtype) {
  const std::vector<Shape> shapes = {{300001}, {7, 149}, {1}, {0}, {11}};
  std::vector<Tensor> params;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = make_param(Tensor::zeros(shapes[i], DType::f64), dtype, device);
    if (i != 4) p.set_grad(copy_to(random_f64(shapes[i], 40 + i, -3.0, 3.0), dtype, device));
    params.push_back(p);
  }
  return params;
}

double reference_norm(const std::vector<Tensor>& params) {
  double total = 0;
  for (const Tensor& p : params)
    if (p.grad().defined())
      for (double v : p.grad().to_vector<double>()) total += v * v;
  return std::sqrt(total);
}

TEST_P(CudaOptimizer, GradNormMatchesFloat64AndIsTheSameEveryRun) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const std::vector<Tensor> params = clipping_params(GetParam(), dtype);
    const double expected = reference_norm(params);
    const double norm = grad_norm(params);
    EXPECT_NEAR(norm, expected, 1e-12 * expected) << dtype_name(dtype);
    EXPECT_EQ(grad_norm(params), norm) << "the sum of squares is in a fixed order";
  }
}

TEST_P(CudaOptimizer, ClipGradNormScalesEveryGradient) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const std::vector<Tensor> params = clipping_params(GetParam(), dtype);
    std::vector<std::vector<double>> before;
    for (const Tensor& p : params)
      before.push_back(p.grad().defined() ? p.grad().to_vector<double>() : std::vector<double>{});
    const double norm = reference_norm(params);
    const double max_norm = norm / 3;
    EXPECT_NEAR(clip_grad_norm(params, max_norm), norm, 1e-12 * norm);
    const double coefficient = max_norm / (norm + 1e-6);
    const double tolerance = cpu_tolerance(dtype);
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].grad().defined()) continue;
      EXPECT_EQ(params[i].grad().device(), GetParam());
      std::vector<double> expected = before[i];
      for (double& v : expected) v *= coefficient;
      testing::expect_all_close(params[i].grad(), expected, tolerance, tolerance);
    }
    EXPECT_NEAR(reference_norm(params), max_norm, 1e-5 * max_norm);
  }
}

TEST_P(CudaOptimizer, ClipGradNormBelowTheLimitLeavesGradientsAlone) {
  const std::vector<Tensor> params = clipping_params(GetParam(), DType::f32);
  const std::vector<double> before = params[1].grad().to_vector<double>();
  const double norm = reference_norm(params);
  EXPECT_NEAR(clip_grad_norm(params, 2 * norm), norm, 1e-12 * norm);
  testing::expect_all_close(params[1].grad(), before, 0, 0);
}

TEST_P(CudaOptimizer, ClipGradNormScalesStridedGradientsInPlace) {
  const Tensor values = random_f64({5, 7}, 9);
  Tensor p = make_param(Tensor::zeros({7, 5}, DType::f64), DType::f64, GetParam());
  const Tensor grad = transpose(copy_to(values, DType::f64, GetParam()), 0, 1);
  ASSERT_FALSE(grad.is_contiguous());
  p.set_grad(grad);
  const std::vector<double> before = grad.to_vector<double>();
  const double norm = reference_norm({p});
  clip_grad_norm({p}, 0.5);
  EXPECT_TRUE(p.grad().is_same(grad)) << "clipping writes into the gradient it was given";
  std::vector<double> expected = before;
  for (double& v : expected) v *= 0.5 / (norm + 1e-6);
  testing::expect_all_close(p.grad(), expected, 1e-14, 1e-14);
}

TEST_P(CudaOptimizer, ClipGradNormReportsANonFiniteNorm) {
  std::vector<Tensor> params = clipping_params(GetParam(), DType::f32);
  Tensor bad = Tensor::from_vector<float>({1.0f, std::numeric_limits<float>::quiet_NaN()}, {2}, GetParam());
  Tensor p = make_param(Tensor::zeros({2}, DType::f64), DType::f32, GetParam());
  p.set_grad(bad);
  params.push_back(p);
  EXPECT_TRUE(std::isnan(grad_norm(params)));
  EXPECT_THROW(clip_grad_norm(params, 1.0, /*error_if_nonfinite=*/true), Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaOptimizer, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep::optim
