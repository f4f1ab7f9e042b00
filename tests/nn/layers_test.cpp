// Each layer's forward equals the functional op it wraps with its own parameters; Dropout
// keys its masks by the ForwardContext; the built-in models run forward and backward.
#include <gtest/gtest.h>

#include "lockstep/nn/nn.h"
#include "lockstep/ops/ops.h"
#include "testing/gradcheck.h"

namespace lockstep::nn {
namespace {

using testing::random_f32;

void expect_same_values(const Tensor& actual, const Tensor& expected) {
  ASSERT_EQ(actual.shape(), expected.shape());
  EXPECT_EQ(actual.to_vector<float>(), expected.to_vector<float>());
}

TEST(Layers, LinearIsLinear) {
  Linear layer(5, 3);
  const Tensor x = random_f32({4, 5}, 1);
  expect_same_values(layer(x), linear(x, layer.weight, layer.bias));
  Linear no_bias(5, 3, false);
  EXPECT_FALSE(no_bias.bias.defined());
  EXPECT_EQ(no_bias.named_parameters().size(), 1u);
  expect_same_values(no_bias(x), linear(x, no_bias.weight));
  EXPECT_THROW(Linear(0, 3), Error);
}

TEST(Layers, Conv2dAndMaxPool2dAreTheirOps) {
  Conv2d conv(2, 4, 3, 2, 1);
  const Tensor x = random_f32({2, 2, 9, 9}, 2);
  expect_same_values(conv(x), conv2d(x, conv.weight, conv.bias, {2, 2}, {1, 1}));
  EXPECT_EQ(conv(x).shape(), (Shape{2, 4, 5, 5}));
  MaxPool2d pool(2);
  EXPECT_EQ(pool.stride, 2);
  expect_same_values(pool(x), max_pool2d(x, {2, 2}, {2, 2}));
  MaxPool2d overlapping(3, 1);
  expect_same_values(overlapping(x), max_pool2d(x, {3, 3}, {1, 1}));
}

TEST(Layers, ActivationsAndFlattenAreTheirOps) {
  const Tensor x = random_f32({2, 3, 4}, 3);
  expect_same_values(ReLU()(x), relu(x));
  expect_same_values(GELU()(x), gelu(x));
  expect_same_values(Flatten()(x), reshape(x, {2, 12}));
  expect_same_values(Flatten(0, 1)(x), reshape(x, {6, 4}));
}

TEST(Layers, LayerNormAndEmbeddingAreTheirOps) {
  LayerNorm norm(Shape{3, 4}, 1e-3);
  norm.weight.copy_from(random_f32({3, 4}, 5));
  norm.bias.copy_from(random_f32({3, 4}, 6));
  const Tensor x = random_f32({2, 3, 4}, 4);
  expect_same_values(norm(x), layer_norm(x, {3, 4}, norm.weight, norm.bias, 1e-3));
  LayerNorm plain(4, 1e-5, false);
  EXPECT_TRUE(plain.named_parameters().empty());
  expect_same_values(plain(x), layer_norm(x, {4}));

  Embedding table(10, 3);
  const Tensor indices = Tensor::from_vector<int64_t>({0, 9, 4, 4}, {2, 2});
  expect_same_values(table(indices), embedding(indices, table.weight));
  EXPECT_EQ(table(indices).shape(), (Shape{2, 2, 3}));
}

TEST(Layers, SequentialChainsItsChildren) {
  auto fc1 = std::make_shared<Linear>(6, 5);
  auto fc2 = std::make_shared<Linear>(5, 2);
  Sequential seq{std::make_shared<Flatten>(), fc1, std::make_shared<ReLU>(), fc2};
  const Tensor x = random_f32({3, 2, 3}, 7);
  expect_same_values(seq(x), linear(relu(linear(reshape(x, {3, 6}), fc1->weight, fc1->bias)), fc2->weight, fc2->bias));
}

TEST(Layers, DropoutIsIdentityInEvalAndNeedsAContextInTraining) {
  Dropout drop(0.5);
  const Tensor x = random_f32({4, 8}, 8);
  drop.eval();
  expect_same_values(drop(x), x);
  drop.train();
  EXPECT_THROW(drop(x), Error);
  expect_same_values(Dropout(0.0)(x), x);
  EXPECT_THROW(Dropout(1.0), Error);
}

TEST(Layers, DropoutKeysByContextAndLayerPosition) {
  auto first = std::make_shared<Dropout>(0.5);
  auto second = std::make_shared<Dropout>(0.3);
  Sequential seq{std::make_shared<Linear>(8, 8), first, std::make_shared<ReLU>(), second};
  seq.set_forward_context({.seed = 3, .step = 7, .first_sample = 100});
  EXPECT_EQ(first->random_layer_index(), 0);
  EXPECT_EQ(second->random_layer_index(), 1);
  const Tensor x = random_f32({6, 8}, 9);
  expect_same_values((*first)(x), dropout(x, 0.5, true, {3, dropout_stream(0, 7), 100}));
  expect_same_values((*second)(x), dropout(x, 0.3, true, {3, dropout_stream(1, 7), 100}));
  EXPECT_NE((*first)(x).to_vector<float>(), dropout(x, 0.5, true, {3, dropout_stream(0, 8), 100}).to_vector<float>());

  // Samples 102..105 get the same masks when they arrive as their own micro-batch.
  const Tensor whole = (*first)(x);
  seq.set_forward_context({.seed = 3, .step = 7, .first_sample = 102});
  expect_same_values((*first)(slice(x, 0, 2, 6)), slice(whole, 0, 2, 6).contiguous());
}

TEST(Layers, BuiltInModelsRunForwardAndBackward) {
  for (const std::string name : {"cnn", "mlp"}) {
    const auto model = make_model(name, 1);
    const Tensor x = random_f32({3, 1, 28, 28}, 10);
    const Tensor logits = (*model)(x);
    ASSERT_EQ(logits.shape(), (Shape{3, 10})) << name;
    logits.backward(Tensor::ones({3, 10}));
    for (const auto& [param, t] : model->named_parameters()) {
      ASSERT_TRUE(t.grad().defined()) << name << " " << param;
      EXPECT_EQ(t.grad().shape(), t.shape()) << name << " " << param;
    }
  }
}

TEST(Layers, CnnForwardIsThePyTorchComposition) {
  const auto model = make_model("cnn", 2);
  const auto& cnn = static_cast<CNN&>(*model);
  const Tensor x = random_f32({2, 1, 28, 28}, 11);
  Tensor h = max_pool2d(relu(conv2d(x, cnn.conv1->weight, cnn.conv1->bias)), {2, 2});
  h = max_pool2d(relu(conv2d(h, cnn.conv2->weight, cnn.conv2->bias)), {2, 2});
  h = relu(linear(reshape(h, {2, 1600}), cnn.fc1->weight, cnn.fc1->bias));
  expect_same_values((*model)(x), linear(h, cnn.fc2->weight, cnn.fc2->bias));
}

}  // namespace
}  // namespace lockstep::nn
