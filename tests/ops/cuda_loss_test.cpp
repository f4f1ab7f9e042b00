// Softmax, log-softmax and cross-entropy on each test device, forward and backward, against
// the CPU ops run in float64 on the same values: rows shorter and longer than the GPU's
// warp-per-row limit (1024), lengths that are no multiple of a block, strided axes, large
// and -inf logits, every reduction and label dtype, empty batches, and the label errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "lockstep/ops/loss.h"
#include "testing/device_tensors.h"
#include "testing/devices.h"
#include "testing/errors.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::error_of;
using testing::expect_close;
using testing::expect_identical;
using testing::leaf_on;
using testing::max_abs;
using testing::random_f64;
using testing::reference_rtol;

// Random labels in [0, classes) of the given dtype, on the CPU.
Tensor random_labels(int64_t rows, int64_t classes, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, classes - 1);
  std::vector<int64_t> values(static_cast<size_t>(rows));
  for (auto& v : values) v = pick(rng);
  return Tensor::from_vector(values, {rows}).to(dtype);
}

struct SoftmaxCase {
  Shape shape;
  int64_t axis;
};

class CudaLoss : public testing::DeviceTest {};

TEST_P(CudaLoss, SoftmaxAndLogSoftmaxMatchFloat64ForwardAndBackward) {
  const Device device = GetParam();
  const std::vector<SoftmaxCase> cases = {
      {{5, 37}, -1},     // a warp per row, rows shorter than a warp's sweep
      {{3, 1024}, 1},    // the longest warp-per-row rows
      {{3, 1500}, 1},    // a block per row, not a multiple of the block
      {{2, 40000}, -1},  // long rows
      {{2, 7, 3}, 1},    // a strided axis
      {{4, 5, 6}, 0},    // the outermost axis
      {{6}, 0},          // one row
      {{0, 5}, 1},       // no rows
      {{4, 0}, 1},       // empty rows
  };
  uint64_t seed = 1;
  for (const SoftmaxCase& c : cases) {
    for (DType dtype : {DType::f32, DType::f64}) {
      for (bool log : {false, true}) {
        SCOPED_TRACE(shape_str(c.shape) + " axis " + std::to_string(c.axis) + " " + dtype_name(dtype) +
                     (log ? " log_softmax" : " softmax"));
        const Tensor host_x = random_f64(c.shape, ++seed, -4, 4).to(dtype);
        const Tensor host_g = random_f64(c.shape, ++seed).to(dtype);
        auto op = [&](const Tensor& x) { return log ? log_softmax(x, c.axis) : softmax(x, c.axis); };

        Tensor reference_x = leaf_on(host_x.to(DType::f64), Device::cpu());
        const Tensor reference_y = op(reference_x);
        reference_y.backward(host_g.to(DType::f64));

        Tensor x = leaf_on(host_x, device);
        const Tensor y = op(x);
        EXPECT_EQ(y.device(), device);
        EXPECT_EQ(y.dtype(), dtype);
        y.backward(host_g.to(device));
        ASSERT_TRUE(x.grad().defined());
        EXPECT_EQ(x.grad().device(), device);
        const double rtol = reference_rtol(dtype);
        // Log-probabilities carry the rounding of x - max and of the log of the sum: absolute
        // errors of the size of the largest value; probabilities are accurate relative to each.
        expect_close(y.to(Device::cpu()), reference_y, rtol, log ? rtol * max_abs(reference_y) : rtol * 1e-3);
        expect_close(x.grad().to(Device::cpu()), reference_x.grad(), rtol, rtol * max_abs(reference_x.grad()));
      }
    }
  }
}

TEST_P(CudaLoss, SoftmaxOfLargeAndMaskedLogits) {
  const Device device = GetParam();
  const float inf = std::numeric_limits<float>::infinity();
  // Large logits need the max subtracted; -inf entries (a causal mask) get probability 0.
  const Tensor host = Tensor::from_vector<float>({1000, 1001, 1002, -1000, 0, 1000, -inf, 0, 0, 1, -inf, -inf}, {3, 4});
  const auto p = softmax(host.to(device)).to_vector<double>();
  const double e = std::exp(1.0), z = 1 + 1 / e + 1 / (e * e);
  const std::vector<double> expected = {1 / (e * e * z), 1 / (e * z), 1 / z, 0, 0, 1, 0, 0,
                                        1 / (1 + e),     e / (1 + e), 0,     0};
  ASSERT_EQ(p.size(), expected.size());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], expected[i], 1e-6) << "element " << i;
  EXPECT_EQ(p[6], 0.0);  // exp(-inf) is exactly 0
  EXPECT_EQ(p[11], 0.0);
  const auto logp = log_softmax(host.to(device)).to_vector<double>();
  EXPECT_NEAR(logp[2], -std::log(z), 1e-6);
  EXPECT_NEAR(logp[3], -2002 - std::log(z), 1e-3);
  EXPECT_EQ(logp[6], -inf);
  EXPECT_NEAR(logp[9], 1 - std::log(1 + e), 1e-6);
}

TEST_P(CudaLoss, CrossEntropyMatchesFloat64ForEveryReductionAndLabelType) {
  const Device device = GetParam();
  struct Case {
    int64_t rows, classes;
  };
  // Warp per row (classes <= 1024) and block per row; the loss sum crosses a block of rows.
  const std::vector<Case> cases = {{37, 10}, {300, 1024}, {19, 3000}, {1, 1}};
  uint64_t seed = 100;
  for (const Case& c : cases) {
    for (DType dtype : {DType::f32, DType::f64}) {
      for (DType label_dtype : {DType::i64, DType::i32}) {
        for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
          SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.classes) + " " + dtype_name(dtype) + " " +
                       dtype_name(label_dtype) + " reduction " + std::to_string(static_cast<int>(reduction)));
          const Tensor host_x = random_f64({c.rows, c.classes}, ++seed, -5, 5).to(dtype);
          const Tensor labels = random_labels(c.rows, c.classes, label_dtype, ++seed);
          const Tensor host_g =
              reduction == Reduction::none ? random_f64({c.rows}, ++seed).to(dtype) : Tensor::scalar(1.75, dtype);

          Tensor reference_x = leaf_on(host_x.to(DType::f64), Device::cpu());
          const Tensor reference_loss = cross_entropy(reference_x, labels, reduction);
          reference_loss.backward(host_g.to(DType::f64));

          Tensor x = leaf_on(host_x, device);
          const Tensor loss = cross_entropy(x, labels.to(device), reduction);
          EXPECT_EQ(loss.device(), device);
          loss.backward(host_g.to(device));
          const double rtol = reference_rtol(dtype);
          // A row's loss is lse - logit, a difference of values as large as the logits.
          expect_close(loss.to(Device::cpu()), reference_loss, rtol, rtol * max_abs(host_x));
          expect_close(x.grad().to(Device::cpu()), reference_x.grad(), rtol, rtol * max_abs(reference_x.grad()));
        }
      }
    }
  }
}

TEST_P(CudaLoss, CrossEntropyOverAGpt2Vocabulary) {
  const Device device = GetParam();
  const int64_t rows = 48, classes = 50257;
  const Tensor host_x = random_f64({rows, classes}, 7, -8, 8).to(DType::f32);
  const Tensor labels = random_labels(rows, classes, DType::i64, 8);
  Tensor reference_x = leaf_on(host_x.to(DType::f64), Device::cpu());
  const Tensor reference_loss = cross_entropy(reference_x, labels);
  reference_loss.backward();
  Tensor x = leaf_on(host_x, device);
  const Tensor loss = cross_entropy(x, labels.to(device));
  loss.backward(Tensor::scalar(1.0, DType::f32, device));
  expect_close(loss.to(Device::cpu()), reference_loss, 1e-5, 0);
  expect_close(x.grad().to(Device::cpu()), reference_x.grad(), 1e-5, 1e-5 * max_abs(reference_x.grad()));
}

TEST_P(CudaLoss, StridedLogitsAndLabels) {
  const Device device = GetParam();
  const Tensor base = random_f64({5, 8}, 6).to(device);
  const Tensor logits = base.as_strided({4, 5}, {2, 8}, 1);  // base[:, 1::2].T
  const Tensor label_base = Tensor::from_vector<int64_t>({3, 9, 0, 9, 4, 9, 1}, {7}).to(device);
  const Tensor labels = label_base.as_strided({4}, {2}, 0);  // {3, 0, 4, 1}
  const Tensor host_logits = random_f64({5, 8}, 6).as_strided({4, 5}, {2, 8}, 1);
  const Tensor expected = cross_entropy(host_logits, Tensor::from_vector<int64_t>({3, 0, 4, 1}, {4}), Reduction::none);
  expect_close(cross_entropy(logits, labels, Reduction::none).to(Device::cpu()), expected, 1e-12, 1e-12);
  // Softmax along axis 0 of a transposed view.
  expect_close(softmax(logits, 0).to(Device::cpu()), softmax(host_logits, 0), 1e-12, 1e-14);
}

TEST_P(CudaLoss, EmptyBatch) {
  const Device device = GetParam();
  const Tensor logits = Tensor::zeros({0, 7}, DType::f32, device);
  const Tensor labels = Tensor::zeros({0}, DType::i64, device);
  EXPECT_EQ(cross_entropy(logits, labels, Reduction::sum).item(), 0.0);
  EXPECT_TRUE(std::isnan(cross_entropy(logits, labels, Reduction::mean).item()));  // 0 / 0, as on the CPU
  EXPECT_EQ(cross_entropy(logits, labels, Reduction::none).shape(), Shape{0});
}

TEST_P(CudaLoss, RunsAreBitIdentical) {
  const Device device = GetParam();
  const Tensor host_x = random_f64({333, 2500}, 21, -6, 6).to(DType::f32);
  const Tensor labels = random_labels(333, 2500, DType::i32, 22).to(device);
  auto run = [&]() {
    Tensor x = leaf_on(host_x, device);
    const Tensor loss = cross_entropy(x, labels);
    loss.backward(Tensor::scalar(1.0, DType::f32, device));
    Tensor s = leaf_on(host_x, device);
    const Tensor p = log_softmax(s, 0);
    p.backward(host_x.to(device));
    return std::vector<Tensor>{loss, x.grad(), p, s.grad()};
  };
  const auto first = run(), second = run();
  for (size_t i = 0; i < first.size(); ++i) expect_identical(first[i], second[i]);
}

TEST_P(CudaLoss, LabelOutOfRangeIsAnErrorNamingIt) {
  const Device device = GetParam();
  const Tensor logits = Tensor::zeros({6, 5}, DType::f32, device);
  for (DType label_dtype : {DType::i64, DType::i32}) {
    SCOPED_TRACE(dtype_name(label_dtype));
    // Two bad labels: the first one is named.
    const Tensor too_big = Tensor::from_vector<int64_t>({0, 1, 2, 5, 9, 4}, {6}).to(label_dtype).to(device);
    const std::string big = error_of([&] { cross_entropy(logits, too_big); });
    EXPECT_NE(big.find("label 5 at position 3"), std::string::npos) << big;
    EXPECT_NE(big.find("5 classes"), std::string::npos) << big;
    const Tensor negative = Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, -1}, {6}).to(label_dtype).to(device);
    const std::string neg = error_of([&] { cross_entropy(logits, negative, Reduction::none); });
    EXPECT_NE(neg.find("label -1 at position 5"), std::string::npos) << neg;
  }
  // The device is still usable after the error.
  const Tensor ok = Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 0}, {6}).to(device);
  EXPECT_NEAR(cross_entropy(logits, ok).item(), std::log(5.0), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaLoss, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
