// Lockstep's built-in models against PyTorch: the same weights and batch (rebuilt here from
// the formula tests/fixtures/make_torch_fixtures.py uses), one forward, mean cross-entropy,
// backward and SGD step, compared with the logits, loss, gradients and updated weights the
// script stored from PyTorch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/io/safetensors.h"
#include "lockstep/nn/models.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/sgd.h"
#include "testing/torch_match.h"

namespace lockstep {
namespace {

using testing::expect_matches;

constexpr int64_t kBatch = 8;
constexpr int64_t kClasses = 10;

// Must equal splitmix64 in make_torch_fixtures.py.
uint64_t splitmix64(uint64_t stream, uint64_t j) {
  uint64_t z = (stream << 32 | j) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double uniform01(uint64_t stream, uint64_t j) { return static_cast<double>(splitmix64(stream, j) >> 40) * 0x1p-24; }

std::string fixture_path(const std::string& model) {
  return std::string(LOCKSTEP_SOURCE_DIR) + "/tests/fixtures/torch_" + model + ".safetensors";
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) parts.push_back(part);
  return parts;
}

// Inputs per output unit of the layer that owns parameter `name` (its weight's dims 1...).
int64_t fan_in(const NamedTensors& params, const std::string& name) {
  const std::string weight = name.substr(0, name.rfind('.')) + ".weight";
  for (const auto& [n, t] : params) {
    if (n != weight) continue;
    int64_t fan = 1;
    for (int64_t axis = 1; axis < t.dim(); ++axis) fan *= t.size(axis);
    return fan;
  }
  ADD_FAILURE() << "no " << weight << " for " << name;
  return 1;
}

// Parameter number i, element j: f32((2u - 1) / sqrt(fan_in)), computed in double as the script does.
void set_formula_weights(nn::Module& model) {
  const NamedTensors params = model.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, t] = params[i];
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in(params, name)));
    float* p = t.data<float>();
    for (int64_t j = 0; j < t.numel(); ++j) {
      p[j] = static_cast<float>((2.0 * uniform01(i, static_cast<uint64_t>(j)) - 1.0) * bound);
    }
  }
}

Tensor formula_images(uint64_t stream) {
  Tensor images = Tensor::empty({kBatch, 1, 28, 28});
  float* p = images.data<float>();
  for (int64_t j = 0; j < images.numel(); ++j) {
    p[j] = static_cast<float>(static_cast<double>(splitmix64(stream, static_cast<uint64_t>(j)) >> 56) / 255.0);
  }
  return images;
}

Tensor formula_labels(uint64_t stream) {
  std::vector<int64_t> labels(kBatch);
  for (int64_t j = 0; j < kBatch; ++j) {
    labels[static_cast<size_t>(j)] = static_cast<int64_t>(splitmix64(stream, static_cast<uint64_t>(j)) % kClasses);
  }
  return Tensor::from_vector(labels, {kBatch});
}

void crosscheck(const std::string& model_name) {
  const TensorFile fixture = load_safetensors(fixture_path(model_name));
  ASSERT_EQ(fixture.metadata.at("model"), model_name);
  const std::shared_ptr<nn::Module> model = nn::make_model(model_name, 0);

  // Parameter i of the formula is the i-th in PyTorch's order; Lockstep's must be the same.
  const NamedTensors params = model->named_parameters();
  std::vector<std::string> names;
  for (const auto& [name, t] : params) names.push_back(name);
  ASSERT_EQ(names, split_commas(fixture.metadata.at("parameters"))) << "parameter order differs from PyTorch's";
  set_formula_weights(*model);
  std::vector<std::vector<float>> before;
  for (const auto& [name, t] : params) before.push_back(t.to_vector<float>());

  // The script stores the batch it built: equal bits show both sides compute the formula alike.
  const Tensor images = formula_images(std::stoull(fixture.metadata.at("input_stream")));
  const Tensor labels = formula_labels(std::stoull(fixture.metadata.at("label_stream")));
  ASSERT_EQ(images.to_vector<float>(), fixture.at("input").to_vector<float>()) << "input formula differs";
  ASSERT_EQ(labels.to_vector<int64_t>(), fixture.at("labels").to_vector<int64_t>()) << "label formula differs";

  optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  sgd.zero_grad();
  const Tensor logits = model->forward(images);
  const Tensor loss = cross_entropy(logits, labels);
  loss.backward();
  expect_matches(logits, fixture.at("logits"), "logits");
  expect_matches(loss, fixture.at("loss"), "loss");
  for (const auto& [name, t] : params) expect_matches(t.grad(), fixture.at("grad." + name), "grad." + name);

  sgd.step();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, t] = params[i];
    // A step that changed nothing would pass for a parameter whose gradient is tiny: insist on motion.
    EXPECT_NE(t.to_vector<float>(), before[i]) << name << " did not change in the SGD step";
    expect_matches(t, fixture.at("after_step." + name), "after_step." + name);
  }
}

TEST(TorchCrosscheck, CnnMatchesPytorch) { crosscheck("cnn"); }

TEST(TorchCrosscheck, MlpMatchesPytorch) { crosscheck("mlp"); }

}  // namespace
}  // namespace lockstep
