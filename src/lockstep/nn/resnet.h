// ResNet's residual block, as torchvision.models.resnet.BasicBlock (expansion 1):
//   out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
// conv1 is 3x3 with the block's stride, conv2 3x3 with stride 1, both padding 1 and no bias.
// The shortcut is the identity, or, when the shape changes (stride != 1 or in_planes !=
// planes), downsample = Sequential(conv 1x1 with the stride and no bias, BatchNorm2d(planes)).
// Children and their order are torchvision's (conv1, bn1, relu, conv2, bn2, downsample), so
// state_dict names ("conv1.weight", "bn1.running_mean", "downsample.0.weight",
// "downsample.1.num_batches_tracked", ...) equal a torchvision block's. Unlike torchvision,
// which takes the downsample module from ResNet._make_layer, the block builds it itself.
#pragma once

#include <memory>

#include "lockstep/nn/activation.h"
#include "lockstep/nn/conv.h"
#include "lockstep/nn/module.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sequential.h"

namespace lockstep::nn {

class BasicBlock : public Module {
 public:
  static constexpr int64_t expansion = 1;

  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride = 1);
  Tensor forward(const Tensor& x) override;

  const int64_t in_planes, planes, stride;
  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<Conv2d> conv2;
  std::shared_ptr<BatchNorm2d> bn2;
  std::shared_ptr<Sequential> downsample;  // null when the shortcut is the identity
};

}  // namespace lockstep::nn
