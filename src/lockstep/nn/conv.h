// 2-D convolution and pooling over NCHW images, as torch.nn.Conv2d, MaxPool2d (square
// kernels, equal strides and padding on both axes) and AdaptiveAvgPool2d (output size 1).
// Conv2d's weight is [out, in, k, k], initialized U(-1/sqrt(in·k·k), +) like its bias.
#pragma once

#include "lockstep/nn/module.h"

namespace lockstep::nn {

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1, int64_t padding = 0,
         bool bias = true);
  Tensor forward(const Tensor& x) override;
  void reset_parameter(const std::string& name, const Tensor& parameter, Philox& rng) override;

  const int64_t in_channels, out_channels, kernel_size, stride, padding;
  Tensor weight;  // [out, in, k, k]
  Tensor bias;    // [out], undefined without bias
};

class MaxPool2d : public Module {
 public:
  // stride 0 means stride = kernel_size (PyTorch's default).
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;

  const int64_t kernel_size, stride, padding;
};

// torch.nn.AdaptiveAvgPool2d for output size 1 only (global average pooling, as ResNets end):
// [N, C, H, W] -> [N, C, 1, 1] (or [C, H, W] -> [C, 1, 1]), the mean of each plane
// (lockstep::mean over the last two axes, with its backward). Other sizes are an Error.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(int64_t output_size = 1);
  Tensor forward(const Tensor& x) override;

  const int64_t output_size;
};

}  // namespace lockstep::nn
