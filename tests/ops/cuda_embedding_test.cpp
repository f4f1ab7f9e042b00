// embedding on each test device: the gather, and the weight gradient, which must sum each
// row's token gradients in token order. That order is the CPU's, so the gradient is compared
// with the CPU op bit for bit (and with a float64 sum), including a GPT-2-sized table with
// heavily repeated tokens. Index errors, i32 and i64 indices, strided and empty indices.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "lockstep/ops/embedding.h"
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
using testing::random_f64;
using testing::reference_rtol;

// Indices in [0, vocab), a third of them from a handful of rows so that rows repeat a lot.
std::vector<int64_t> random_indices(int64_t count, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> any(0, vocab - 1), few(0, std::min<int64_t>(vocab, 5) - 1);
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (auto& v : out) v = rng() % 3 == 0 ? few(rng) : any(rng);
  return out;
}

struct EmbeddingResult {
  Tensor out, grad_weight;  // on the CPU
};

EmbeddingResult run_embedding(const Tensor& indices, const Tensor& weight, const Tensor& dy, Device device) {
  Tensor w = leaf_on(weight, device);
  const Tensor out = embedding(indices.to(device), w);
  EXPECT_EQ(out.device(), device);
  out.backward(dy.to(device));
  return {out.to(Device::cpu()), w.grad().to(Device::cpu())};
}

class CudaEmbedding : public testing::DeviceTest {};

TEST_P(CudaEmbedding, GatherAndGradientMatchTheCpuBitForBit) {
  const Device device = GetParam();
  struct Case {
    Shape indices;
    int64_t vocab, dim;
  };
  const std::vector<Case> cases = {
      {{2, 3}, 5, 3},        // tiny, every row picked more than once or never
      {{7, 11}, 40, 37},     // a width that is no multiple of a warp
      {{300}, 1000, 300},    // wider than a block
      {{4, 256}, 50257, 64}  // a GPT-2 vocabulary
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    for (DType dtype : {DType::f32, DType::f64}) {
      for (DType index_dtype : {DType::i64, DType::i32}) {
        SCOPED_TRACE(shape_str(c.indices) + " into [" + std::to_string(c.vocab) + ", " + std::to_string(c.dim) + "] " +
                     dtype_name(dtype) + " " + dtype_name(index_dtype));
        const std::vector<int64_t> idx = random_indices(numel(c.indices), c.vocab, ++seed);
        const Tensor indices = Tensor::from_vector(idx, c.indices).to(index_dtype);
        const Tensor weight = random_f64({c.vocab, c.dim}, ++seed).to(dtype);
        Shape out_shape = c.indices;
        out_shape.push_back(c.dim);
        const Tensor dy = random_f64(out_shape, ++seed).to(dtype);

        const EmbeddingResult expected = run_embedding(indices, weight, dy, Device::cpu());
        const EmbeddingResult actual = run_embedding(indices, weight, dy, device);
        expect_identical(actual.out, expected.out);
        expect_identical(actual.grad_weight, expected.grad_weight);

        // And against sums written out here, in f64: the CPU op itself is not the only witness.
        const auto w = weight.to_vector<double>(), g = dy.to_vector<double>();
        std::vector<double> gather, grad(static_cast<size_t>(c.vocab * c.dim), 0.0);
        for (size_t i = 0; i < idx.size(); ++i) {
          for (int64_t d = 0; d < c.dim; ++d) {
            gather.push_back(w[static_cast<size_t>(idx[i] * c.dim + d)]);
            grad[static_cast<size_t>(idx[i] * c.dim + d)] += g[i * static_cast<size_t>(c.dim) + static_cast<size_t>(d)];
          }
        }
        testing::expect_all_close(actual.out, gather, 0, 0);
        expect_close(actual.grad_weight, grad, reference_rtol(dtype), reference_rtol(dtype));
      }
    }
  }
}

TEST_P(CudaEmbedding, StridedAndScalarIndices) {
  const Device device = GetParam();
  const Tensor weight = random_f64({9, 5}, 3);
  const Tensor base = Tensor::from_vector<int64_t>({8, 0, 3, 3, 1, 7, 2, 8, 5, 4, 6, 0}, {3, 4});
  const Tensor strided = base.to(device).as_strided({4, 3}, {1, 4}, 0);  // base.T
  const Tensor expected = embedding(base.as_strided({4, 3}, {1, 4}, 0), weight);
  expect_identical(embedding(strided, weight.to(device)).to(Device::cpu()), expected);
  const Tensor scalar = embedding(Tensor::from_vector<int64_t>({6}, {}).to(device), weight.to(device));
  EXPECT_EQ(scalar.shape(), Shape{5});
  expect_identical(scalar.to(Device::cpu()), embedding(Tensor::from_vector<int64_t>({6}, {}), weight));
}

TEST_P(CudaEmbedding, NoIndices) {
  const Device device = GetParam();
  Tensor w = leaf_on(random_f64({6, 4}, 5), device);
  const Tensor out = embedding(Tensor::zeros({2, 0}, DType::i64, device), w);
  EXPECT_EQ(out.shape(), (Shape{2, 0, 4}));
  out.backward(Tensor::zeros({2, 0, 4}, DType::f64, device));
  for (double v : w.grad().to_vector<double>()) ASSERT_EQ(v, 0.0);
}

TEST_P(CudaEmbedding, RunsAreBitIdentical) {
  const Device device = GetParam();
  const Tensor indices = Tensor::from_vector(random_indices(2048, 50257, 9), {8, 256});
  const Tensor weight = random_f64({50257, 48}, 10).to(DType::f32);
  const Tensor dy = random_f64({8, 256, 48}, 11).to(DType::f32);
  const EmbeddingResult first = run_embedding(indices, weight, dy, device);
  const EmbeddingResult second = run_embedding(indices, weight, dy, device);
  expect_identical(first.grad_weight, second.grad_weight);
}

TEST_P(CudaEmbedding, IndexOutsideTheTableIsAnErrorNamingIt) {
  const Device device = GetParam();
  const Tensor weight = Tensor::zeros({5, 3}, DType::f32, device);
  for (DType index_dtype : {DType::i64, DType::i32}) {
    SCOPED_TRACE(dtype_name(index_dtype));
    // Two bad indices: the first one is named.
    const Tensor too_big = Tensor::from_vector<int64_t>({0, 4, 5, 1, 7, 2}, {2, 3}).to(index_dtype).to(device);
    const std::string big = error_of([&] { embedding(too_big, weight); });
    EXPECT_NE(big.find("index 5 (at flat position 2"), std::string::npos) << big;
    EXPECT_NE(big.find("V = 5"), std::string::npos) << big;
    const Tensor negative = Tensor::from_vector<int64_t>({0, 1, -3}, {3}).to(index_dtype).to(device);
    const std::string neg = error_of([&] { embedding(negative, weight); });
    EXPECT_NE(neg.find("index -3 (at flat position 2"), std::string::npos) << neg;
  }
  EXPECT_THROW(embedding(Tensor::zeros({2}, DType::f32, device), weight), Error);  // float indices
  // The device is still usable after the errors.
  const Tensor ok = embedding(Tensor::from_vector<int64_t>({4, 0}, {2}).to(device), weight);
  EXPECT_EQ(ok.shape(), (Shape{2, 3}));
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaEmbedding, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
