#include "lockstep/nn/models.h"

#include "lockstep/nn/init.h"
#include "lockstep/ops/conv.h"
#include "lockstep/ops/elementwise.h"
#include "lockstep/ops/shape_ops.h"

namespace lockstep::nn {

CNN::CNN() : Module("CNN") {
  conv1 = register_module("conv1", std::make_shared<Conv2d>(1, 32, 3));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(32, 64, 3));
  fc1 = register_module("fc1", std::make_shared<Linear>(1600, 128));
  fc2 = register_module("fc2", std::make_shared<Linear>(128, 10));
}

// max_pool2d(relu(c)) computed as relu(max_pool2d(c)): max and relu commute exactly (relu is
// monotonic), values and gradients alike (where the max is <= 0 both orders pass no
// gradient), and the relu then runs on a quarter of the elements, forward and backward.
Tensor CNN::forward(const Tensor& x) {
  Tensor h = relu(max_pool2d((*conv1)(x), {2, 2}));  // [N, 32, 13, 13]
  h = relu(max_pool2d((*conv2)(h), {2, 2}));         // [N, 64, 5, 5]
  h = relu((*fc1)(flatten(h, 1)));
  return (*fc2)(h);
}

MLP::MLP() : Module("MLP") {
  fc1 = register_module("fc1", std::make_shared<Linear>(784, 512));
  fc2 = register_module("fc2", std::make_shared<Linear>(512, 512));
  fc3 = register_module("fc3", std::make_shared<Linear>(512, 10));
}

Tensor MLP::forward(const Tensor& x) {
  Tensor h = relu((*fc1)(flatten(x, 1)));
  h = relu((*fc2)(h));
  return (*fc3)(h);
}

ResNet::ResNet() : Module("ResNet") {
  conv1 = register_module("conv1", std::make_shared<Conv2d>(1, 16, 3, 1, 1, false));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(16));
  const auto stage = [](int64_t in_planes, int64_t planes, int64_t stride) {
    return std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
        std::make_shared<BasicBlock>(in_planes, planes, stride), std::make_shared<BasicBlock>(planes, planes)});
  };
  layer1 = register_module("layer1", stage(16, 16, 1));
  layer2 = register_module("layer2", stage(16, 32, 2));
  layer3 = register_module("layer3", stage(32, 64, 2));
  pool = register_module("pool", std::make_shared<AdaptiveAvgPool2d>(1));
  fc = register_module("fc", std::make_shared<Linear>(64, 10));
}

Tensor ResNet::forward(const Tensor& x) {
  Tensor h = relu((*bn1)((*conv1)(x)));    // [N, 16, 28, 28]
  h = (*layer3)((*layer2)((*layer1)(h)));  // [N, 64, 7, 7]
  return (*fc)(flatten((*pool)(h), 1));
}

std::vector<std::string> model_names() { return {"cnn", "mlp", "resnet"}; }

std::shared_ptr<Module> make_model(const std::string& name, uint64_t seed) {
  std::shared_ptr<Module> model;
  if (name == "cnn") {
    model = std::make_shared<CNN>();
  } else if (name == "mlp") {
    model = std::make_shared<MLP>();
  } else if (name == "resnet") {
    model = std::make_shared<ResNet>();
  } else {
    std::string choices;
    for (const auto& known : model_names()) choices += (choices.empty() ? "" : ", ") + known;
    LOCKSTEP_FAIL() << "unknown model '" << name << "': choose one of " << choices;
  }
  initialize(*model, seed);
  return model;
}

}  // namespace lockstep::nn
