// Initialization: PyTorch's bounds and distributions, drawn from Philox keyed by (seed,
// parameter number) only.
#include "lockstep/nn/init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "lockstep/nn/conv.h"
#include "lockstep/nn/embedding.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/models.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sequential.h"

namespace lockstep::nn {
namespace {

struct Moments {
  double mean = 0, variance = 0, min = 0, max = 0;
};

Moments moments_of(const Tensor& t) {
  const auto v = t.to_vector<double>();
  Moments m;
  m.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  for (double x : v) m.variance += (x - m.mean) * (x - m.mean);
  m.variance /= static_cast<double>(v.size());
  m.min = *std::min_element(v.begin(), v.end());
  m.max = *std::max_element(v.begin(), v.end());
  return m;
}

// Pearson's chi-square statistic of the values against U(-bound, bound) over `bins` bins.
double chi_square_uniform(const Tensor& t, double bound, int bins) {
  std::vector<double> counts(static_cast<size_t>(bins), 0.0);
  const auto v = t.to_vector<double>();
  for (double x : v) {
    const int b = std::min(bins - 1, static_cast<int>((x + bound) / (2 * bound) * bins));
    counts[static_cast<size_t>(std::max(0, b))] += 1;
  }
  const double expected = static_cast<double>(v.size()) / bins;
  double chi = 0;
  for (double c : counts) chi += (c - expected) * (c - expected) / expected;
  return chi;
}

void expect_within(const Tensor& t, double bound) {
  const float limit = static_cast<float>(bound);
  for (float x : t.to_vector<float>()) ASSERT_LE(std::abs(x), limit);
}

TEST(Init, LinearWeightIsUniformWithinPyTorchsBound) {
  Linear layer(1000, 100);
  initialize(layer, 11);
  const double bound = 1.0 / std::sqrt(1000.0);
  expect_within(layer.weight, bound);
  expect_within(layer.bias, bound);
  const Moments m = moments_of(layer.weight);
  const double n = 100000;
  EXPECT_LT(std::abs(m.mean), 5 * bound / std::sqrt(3.0 * n));
  EXPECT_NEAR(m.variance, bound * bound / 3, 0.02 * bound * bound / 3);
  EXPECT_LT(m.min, -0.999 * bound);
  EXPECT_GT(m.max, 0.999 * bound);
  EXPECT_LT(chi_square_uniform(layer.weight, bound, 20), 45.0);  // 19 dof: p < 0.001 above 43.8
  EXPECT_LT(chi_square_uniform(layer.bias, bound, 4), 16.3);     // 3 dof: p < 0.001 above 16.3
}

TEST(Init, Conv2dBoundUsesInputsTimesKernelArea) {
  Conv2d conv(3, 64, 5);
  initialize(conv, 2);
  const double bound = 1.0 / std::sqrt(3.0 * 25);
  expect_within(conv.weight, bound);
  expect_within(conv.bias, bound);
  const Moments m = moments_of(conv.weight);
  EXPECT_LT(m.min, -0.99 * bound);
  EXPECT_GT(m.max, 0.99 * bound);
  EXPECT_NEAR(m.variance, bound * bound / 3, 0.05 * bound * bound / 3);
}

TEST(Init, EmbeddingIsStandardNormalAndLayerNormIsIdentity) {
  Embedding table(1000, 64);
  LayerNorm norm(8);
  norm.weight.fill(3.0);
  norm.bias.fill(-1.0);
  initialize(table, 4);
  initialize(norm, 4);
  const Moments m = moments_of(table.weight);
  EXPECT_LT(std::abs(m.mean), 5.0 / std::sqrt(64000.0));
  EXPECT_NEAR(m.variance, 1.0, 0.03);
  const auto w = table.weight.to_vector<double>();
  const double beyond_2 =
      static_cast<double>(std::count_if(w.begin(), w.end(), [](double x) { return std::abs(x) > 2; })) /
      static_cast<double>(w.size());
  EXPECT_NEAR(beyond_2, 0.0455, 0.005);  // P(|Z| > 2)
  EXPECT_EQ(norm.weight.to_vector<float>(), std::vector<float>(8, 1.0f));
  EXPECT_EQ(norm.bias.to_vector<float>(), std::vector<float>(8, 0.0f));
}

TEST(Init, ParameterNumberKeysItsOwnPhiloxRange) {
  // Independent reference: parameter i of seed s draws U(-b, b) from Philox(s, init, i << 40),
  // one double per element.
  const auto model = make_model("mlp", 5);
  const auto params = model->named_parameters();
  const std::vector<std::pair<size_t, int64_t>> cases{{0, 784}, {1, 784}, {4, 512}};  // (index, fan_in)
  for (const auto& [index, fan] : cases) {
    Philox rng(5, static_cast<uint64_t>(RngStream::init), static_cast<uint64_t>(index) << 40);
    const double bound = std::sqrt(3.0) * std::sqrt(2.0 / 6.0) / std::sqrt(static_cast<double>(fan));
    const auto values = params[index].second.to_vector<float>();
    for (size_t i = 0; i < std::min<size_t>(1000, values.size()); ++i) {
      const float expected = static_cast<float>(-bound + 2 * bound * rng.next_double());
      ASSERT_EQ(values[i], expected) << params[index].first << " element " << i;
    }
  }
}

TEST(Init, SameSeedSameWeightsOtherSeedOtherWeights) {
  const auto a = make_model("cnn", 7), b = make_model("cnn", 7), c = make_model("cnn", 8);
  const NamedTensors sa = a->state_dict(), sb = b->state_dict(), sc = c->state_dict();
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].second.to_vector<float>(), sb[i].second.to_vector<float>()) << sa[i].first;
    EXPECT_NE(sa[i].second.to_vector<float>(), sc[i].second.to_vector<float>()) << sa[i].first;
  }
  // Re-initializing restores the same values after training changed them.
  sa[0].second.fill(0.0);
  initialize(*a, 7);
  EXPECT_EQ(sa[0].second.to_vector<float>(), sb[0].second.to_vector<float>());
}

TEST(Init, EqualLayersGetDifferentWeightsInOneModel) {
  Sequential seq{std::make_shared<Linear>(4, 4), std::make_shared<Linear>(4, 4)};
  const NamedTensors before = seq.named_parameters();
  // Built alone, both are initialize(layer, 0): equal. Initialized as a tree, they differ.
  EXPECT_EQ(before[0].second.to_vector<float>(), before[2].second.to_vector<float>());
  initialize(seq, 0);
  EXPECT_NE(before[0].second.to_vector<float>(), before[2].second.to_vector<float>());
}

TEST(Init, ConstructorInitIsSeedZero) {
  Linear alone(784, 512);
  const auto model = make_model("mlp", 0);
  EXPECT_EQ(alone.weight.to_vector<float>(), std::static_pointer_cast<MLP>(model)->fc1->weight.to_vector<float>());
}

}  // namespace
}  // namespace lockstep::nn
