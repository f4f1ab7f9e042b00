// What the data-parallel tests share: a synthetic batch that depends only on (batch, step),
// and a model's weights as bits to compare.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "lockstep/core/philox.h"
#include "lockstep/core/tensor.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/module.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/layout.h"

namespace lockstep::parallel::step_testing {

constexpr uint64_t kSeed = 7;

struct Data {
  Tensor images, labels;
};

// Images [batch, 1, 28, 28] in [0, 1) and labels in [0, 10), from Philox(kSeed, 1000 + step).
inline Data synthetic(int64_t batch, uint64_t step) {
  Philox rng(kSeed, 1000 + step);
  std::vector<float> pixels(static_cast<size_t>(batch) * 784);
  for (float& p : pixels) p = uint_to_unit_float(rng.next_u32());
  std::vector<int64_t> labels(static_cast<size_t>(batch));
  for (int64_t& l : labels) l = static_cast<int64_t>(rng.next_u32() % 10);
  return {Tensor::from_vector(pixels, {batch, 1, 28, 28}), Tensor::from_vector(labels, {batch})};
}

// A regression batch of `n` samples from Philox(kSeed, stream): x1 [n, 6], x2 [n, 3] and
// float targets y [n, 2] that depend on both inputs.
inline TensorBatch two_input_batch(int64_t n, uint64_t stream) {
  Philox rng(kSeed, stream);
  std::vector<float> x1(static_cast<size_t>(n * 6)), x2(static_cast<size_t>(n * 3)), y(static_cast<size_t>(n * 2));
  for (float& v : x1) v = uint_to_unit_float(rng.next_u32()) - 0.5f;
  for (float& v : x2) v = uint_to_unit_float(rng.next_u32()) - 0.5f;
  for (int64_t i = 0; i < n; ++i) {
    y[static_cast<size_t>(2 * i)] = x1[static_cast<size_t>(6 * i)] - 2 * x2[static_cast<size_t>(3 * i + 1)];
    y[static_cast<size_t>(2 * i + 1)] = x1[static_cast<size_t>(6 * i + 3)] * x2[static_cast<size_t>(3 * i + 2)];
  }
  return {{"x1", Tensor::from_vector(x1, {n, 6})},
          {"x2", Tensor::from_vector(x2, {n, 3})},
          {"y", Tensor::from_vector(y, {n, 2})}};
}

// The batch as the layouts take it, and the loss of its fields.
inline TensorBatch as_batch(const Data& data) { return {{"input", data.images}, {"target", data.labels}}; }
inline LossFunction classification() { return classification_loss("input", "target"); }

// One step of `layout` on a global batch whose first sample has global index first_sample.
inline StepResult train_step(Layout& layout, const Data& data, int64_t first_sample, uint64_t step) {
  return layout.step(as_batch(data), {.seed = kSeed, .step = step, .first_sample = first_sample});
}

using Weights = std::vector<std::vector<float>>;

inline Weights weights(nn::Module& model) {
  Weights out;
  for (const Tensor& p : model.parameters()) out.push_back(p.to_vector<float>());
  return out;
}

// Every state_dict entry (parameters and buffers, e.g. running statistics) as its name and
// raw bytes: equal vectors, equal bits.
inline std::vector<std::string> state_bits(const nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : model.state_dict()) {
    const Tensor c = tensor.contiguous();
    out.push_back(name + ":" + std::string(static_cast<const char*>(c.raw_data()), c.nbytes()));
  }
  return out;
}

inline bool same_bits(const Weights& a, const Weights& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0) return false;
  }
  return true;
}

// A parameter forward never uses gets no gradient: data parallelism counts it as zero.
class WithUnusedParameter : public nn::Module {
 public:
  WithUnusedParameter() : nn::Module("WithUnusedParameter") {
    used = register_module("used", std::make_shared<nn::Linear>(784, 10));
    unused = register_module("unused", std::make_shared<nn::Linear>(3, 3));
  }
  Tensor forward(const Tensor& x) override { return (*used)(reshape(x, {x.size(0), 784})); }
  std::shared_ptr<nn::Linear> used, unused;
};

}  // namespace lockstep::parallel::step_testing
