// BatchNorm1d, BatchNorm2d, BasicBlock and AdaptiveAvgPool2d against PyTorch: the network of
// tests/fixtures/make_batchnorm_fixture.py, loaded from its state_dict, one training forward,
// mean cross-entropy and backward (logits, loss, every gradient, every buffer after the
// running-statistics update), then an eval forward with the updated statistics.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/io/safetensors.h"
#include "lockstep/nn/nn.h"
#include "lockstep/ops/ops.h"
#include "testing/torch_match.h"

namespace lockstep {
namespace {

using testing::expect_matches;

// make_batchnorm_fixture.py's BatchNormNet, child for child.
class BatchNormNet : public nn::Module {
 public:
  BatchNormNet() : Module("BatchNormNet") {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1, /*bias=*/false));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(8));
    relu = register_module("relu", std::make_shared<nn::ReLU>());
    layer1 = register_module("layer1", std::make_shared<nn::BasicBlock>(8, 8));
    layer2 = register_module("layer2", std::make_shared<nn::BasicBlock>(8, 16, 2));
    pool = register_module("pool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(16, 32, /*bias=*/false));
    bn2 = register_module("bn2", std::make_shared<nn::BatchNorm1d>(32, 1e-5, std::nullopt));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(32, 10));
  }

  Tensor forward(const Tensor& x) override {
    Tensor h = (*relu)((*bn1)((*conv1)(x)));
    h = (*layer2)((*layer1)(h));
    h = (*pool)(h);
    h = reshape(h, {h.size(0), h.size(1)});
    h = (*relu)((*bn2)((*fc1)(h)));
    return (*fc2)(h);
  }

  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::ReLU> relu;
  std::shared_ptr<nn::BasicBlock> layer1, layer2;
  std::shared_ptr<nn::AdaptiveAvgPool2d> pool;
  std::shared_ptr<nn::Linear> fc1;
  std::shared_ptr<nn::BatchNorm1d> bn2;
  std::shared_ptr<nn::Linear> fc2;
};

std::string joined_names(const NamedTensors& tensors) {
  std::ostringstream out;
  for (size_t i = 0; i < tensors.size(); ++i) out << (i > 0 ? "," : "") << tensors[i].first;
  return out.str();
}

TEST(BatchNormTorch, ResidualNetworkMatchesPytorchInTrainAndEval) {
  const TensorFile fixture =
      load_safetensors(std::string(LOCKSTEP_SOURCE_DIR) + "/tests/fixtures/torch_batchnorm.safetensors");
  ASSERT_EQ(fixture.metadata.at("model"), "batchnorm");
  BatchNormNet model;

  // PyTorch's names in PyTorch's order, parameters and buffers alike: the state_dict loads unchanged.
  ASSERT_EQ(joined_names(model.state_dict()), fixture.metadata.at("state_dict"));
  ASSERT_EQ(joined_names(model.named_parameters()), fixture.metadata.at("parameters"));
  ASSERT_EQ(joined_names(model.named_buffers()), fixture.metadata.at("buffers"));
  NamedTensors state;
  for (const auto& [name, t] : model.state_dict()) state.emplace_back(name, fixture.at("state." + name));
  model.load_state_dict(state);
  EXPECT_EQ(model.bn1->num_batches_tracked.dtype(), DType::i64);
  EXPECT_EQ(model.bn1->num_batches_tracked.shape(), Shape{});
  EXPECT_EQ(model.bn1->num_batches_tracked.item(), 3);

  model.train();
  const Tensor input = fixture.at("input");
  const Tensor logits = model(input);
  const Tensor loss = cross_entropy(logits, fixture.at("labels"));
  loss.backward();
  expect_matches(logits, fixture.at("logits"), "logits");
  expect_matches(loss, fixture.at("loss"), "loss");
  for (const auto& [name, t] : model.named_parameters())
    expect_matches(t.grad(), fixture.at("grad." + name), "grad." + name);
  for (const auto& [name, t] : model.named_buffers()) {
    const Tensor want = fixture.at("after." + name);
    if (t.dtype() == DType::i64) {
      EXPECT_EQ(t.shape(), want.shape()) << name;
      EXPECT_EQ(t.to_vector<int64_t>(), want.to_vector<int64_t>()) << name;
    } else {
      expect_matches(t, want, "after." + name);
    }
  }

  model.eval();
  expect_matches(model(input), fixture.at("eval_logits"), "eval_logits");
}

}  // namespace
}  // namespace lockstep
