#include "lockstep/nn/conv.h"

#include <cmath>

#include "lockstep/nn/init.h"
#include "lockstep/ops/conv.h"
#include "lockstep/ops/reduce.h"

namespace lockstep::nn {

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride_, int64_t padding_, bool with_bias)
    : Module("Conv2d"), in_channels(in), out_channels(out), kernel_size(kernel), stride(stride_), padding(padding_) {
  LOCKSTEP_CHECK(in > 0 && out > 0 && kernel > 0 && stride_ > 0 && padding_ >= 0)
      << "Conv2d(" << in << ", " << out << ", kernel " << kernel << ", stride " << stride_ << ", padding " << padding_
      << "): channels, kernel and stride must be positive, padding non-negative";
  weight = register_parameter("weight", Tensor::zeros({out, in, kernel, kernel}));
  if (with_bias) bias = register_parameter("bias", Tensor::zeros({out}));
  initialize(*this, 0);
}

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, {stride, stride}, {padding, padding}); }

void Conv2d::reset_parameter(const std::string& name, const Tensor& parameter, Philox& rng) {
  if (name == "weight") {
    init::kaiming_uniform_(parameter, std::sqrt(5.0), rng);
  } else {
    init::bias_uniform_(parameter, in_channels * kernel_size * kernel_size, rng);
  }
}

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride_, int64_t padding_)
    : Module("MaxPool2d"), kernel_size(kernel), stride(stride_ == 0 ? kernel : stride_), padding(padding_) {
  LOCKSTEP_CHECK(kernel > 0 && stride_ >= 0 && padding_ >= 0 && 2 * padding_ <= kernel)
      << "MaxPool2d(kernel " << kernel << ", stride " << stride_ << ", padding " << padding_
      << "): kernel must be positive, stride >= 0 (0 = kernel), and padding at most half the kernel";
}

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, {kernel_size, kernel_size}, {stride, stride}, {padding, padding});
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(int64_t size) : Module("AdaptiveAvgPool2d"), output_size(size) {
  LOCKSTEP_CHECK(size == 1) << "AdaptiveAvgPool2d(" << size
                            << "): only output size 1 (global average pooling) is implemented in this version";
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  LOCKSTEP_CHECK(x.dim() == 4 || x.dim() == 3)
      << "AdaptiveAvgPool2d: input must be [N, C, H, W] or [C, H, W], got shape " << shape_str(x.shape());
  LOCKSTEP_CHECK(x.size(-1) > 0 && x.size(-2) > 0)
      << "AdaptiveAvgPool2d: input " << shape_str(x.shape()) << " has empty planes, which have no average";
  return mean(x, {-2, -1}, /*keepdim=*/true);
}

}  // namespace lockstep::nn
