#include "lockstep/nn/resnet.h"

#include "lockstep/ops/elementwise.h"

namespace lockstep::nn {

BasicBlock::BasicBlock(int64_t in, int64_t out, int64_t stride_)
    : Module("BasicBlock"), in_planes(in), planes(out), stride(stride_) {
  LOCKSTEP_CHECK(in > 0 && out > 0 && stride_ > 0)
      << "BasicBlock(" << in << ", " << out << ", stride " << stride_ << "): planes and stride must be positive";
  conv1 = register_module("conv1", std::make_shared<Conv2d>(in, out, 3, stride_, 1, /*bias=*/false));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(out));
  relu = register_module("relu", std::make_shared<ReLU>());
  conv2 = register_module("conv2", std::make_shared<Conv2d>(out, out, 3, 1, 1, /*bias=*/false));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(out));
  if (stride_ != 1 || in != out * expansion) {
    downsample = register_module("downsample", std::make_shared<Sequential>());
    downsample->push_back(std::make_shared<Conv2d>(in, out * expansion, 1, stride_, 0, /*bias=*/false));
    downsample->push_back(std::make_shared<BatchNorm2d>(out * expansion));
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = (*relu)((*bn1)((*conv1)(x)));
  out = (*bn2)((*conv2)(out));
  const Tensor identity = downsample ? (*downsample)(x) : x;
  return (*relu)(out + identity);
}

}  // namespace lockstep::nn
