// The built-in models the CLI trains by name. Parameter names and layouts equal those of the
// equivalent PyTorch nn.Module (given beside each), so weights move between Lockstep and
// PyTorch unchanged. Inputs are [N, 1, 28, 28] f32 images (Fashion-MNIST); outputs are
// [N, 10] logits.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockstep/nn/conv.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/module.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/resnet.h"

namespace lockstep::nn {

// class CNN(nn.Module):
//     conv1 = nn.Conv2d(1, 32, 3); conv2 = nn.Conv2d(32, 64, 3)
//     fc1 = nn.Linear(1600, 128); fc2 = nn.Linear(128, 10)
//     forward: max_pool2d(relu(conv1(x)), 2) -> max_pool2d(relu(conv2(.)), 2) -> flatten(1)
//              -> relu(fc1(.)) -> fc2(.)
class CNN : public Module {
 public:
  CNN();
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<Linear> fc1, fc2;
};

// class MLP(nn.Module):
//     fc1 = nn.Linear(784, 512); fc2 = nn.Linear(512, 512); fc3 = nn.Linear(512, 10)
//     forward: flatten(1) -> relu(fc1(.)) -> relu(fc2(.)) -> fc3(.)
class MLP : public Module {
 public:
  MLP();
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Linear> fc1, fc2, fc3;
};

// A small ResNet for 28x28 images, a ResNet-14 in the CIFAR ResNets' shape: three stages
// of two of torchvision's BasicBlocks (nn/resnet.h) each, named as torchvision's
// (layer1.0.conv1.weight, ...):
// class ResNet(nn.Module):
//     conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False); bn1 = nn.BatchNorm2d(16)
//     layer1 = Sequential(BasicBlock(16, 16), BasicBlock(16, 16))
//     layer2 = Sequential(BasicBlock(16, 32, 2), BasicBlock(32, 32))
//     layer3 = Sequential(BasicBlock(32, 64, 2), BasicBlock(64, 64))
//     fc = nn.Linear(64, 10)
//     forward: relu(bn1(conv1(x))) -> layer1 -> layer2 -> layer3 [N, 64, 7, 7]
//              -> adaptive_avg_pool2d(1) -> flatten(1) -> fc(.)
// With one block per stage one epoch of PyTorch on Fashion-MNIST reached 0.892; two blocks,
// at twice the work, 0.903-0.909 (seeds 0-2, `lockstep train`'s ResNet recipe).
class ResNet : public Module {
 public:
  ResNet();
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
  std::shared_ptr<Sequential> layer1, layer2, layer3;
  std::shared_ptr<AdaptiveAvgPool2d> pool;
  std::shared_ptr<Linear> fc;
};

// The names make_model accepts.
std::vector<std::string> model_names();

// A model by name ("cnn", "mlp", "resnet"), initialized by initialize(model, seed). An unknown name is
// an Error listing the choices.
std::shared_ptr<Module> make_model(const std::string& name, uint64_t seed = 0);

}  // namespace lockstep::nn
