// Module mechanics: names and order as PyTorch lists them, state_dict round trips, and
// load_state_dict's strict errors.
#include "lockstep/nn/module.h"

#include <gtest/gtest.h>

#include <vector>

#include "lockstep/nn/linear.h"
#include "lockstep/nn/models.h"
#include "lockstep/nn/sequential.h"

namespace lockstep::nn {
namespace {

std::vector<std::string> names_of(const NamedTensors& list) {
  std::vector<std::string> names;
  for (const auto& entry : list) names.push_back(entry.first);
  return names;
}

std::vector<Shape> shapes_of(const NamedTensors& list) {
  std::vector<Shape> shapes;
  for (const auto& entry : list) shapes.push_back(entry.second.shape());
  return shapes;
}

std::string error_of(Module& model, const NamedTensors& state, bool strict = true) {
  try {
    model.load_state_dict(state, strict);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A module with a buffer and a child, to check the state_dict interleaving: own parameters,
// own buffers, then children.
class WithBuffer : public Module {
 public:
  WithBuffer() : Module("WithBuffer") {
    scale = register_parameter("scale", Tensor::ones({2}));
    count = register_buffer("count", Tensor::zeros({1}, DType::i64));
    inner = register_module("inner", std::make_shared<Linear>(2, 3));
    shift = register_parameter("shift", Tensor::zeros({3}));
  }
  Tensor scale, count, shift;
  std::shared_ptr<Linear> inner;
};

TEST(Module, CnnNamesAndShapesMatchPyTorch) {
  const auto model = make_model("cnn");
  const NamedTensors params = model->named_parameters();
  EXPECT_EQ(names_of(params), (std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                                        "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(shapes_of(params),
            (std::vector<Shape>{{32, 1, 3, 3}, {32}, {64, 32, 3, 3}, {64}, {128, 1600}, {128}, {10, 128}, {10}}));
  EXPECT_EQ(names_of(model->state_dict()), names_of(params));
  EXPECT_EQ(model->num_parameters(), 32 * 9 + 32 + 64 * 32 * 9 + 64 + 128 * 1600 + 128 + 10 * 128 + 10);
  for (const Tensor& p : model->parameters()) EXPECT_TRUE(p.requires_grad());
}

TEST(Module, MlpNamesAndShapesMatchPyTorch) {
  const auto model = make_model("mlp");
  const NamedTensors params = model->named_parameters();
  EXPECT_EQ(names_of(params),
            (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"}));
  EXPECT_EQ(shapes_of(params), (std::vector<Shape>{{512, 784}, {512}, {512, 512}, {512}, {10, 512}, {10}}));
}

TEST(Module, ToMovesEveryParameterInPlace) {
  const auto model = make_model("mlp");
  const std::vector<Tensor> before = model->parameters();
  std::vector<std::vector<float>> values;
  for (const Tensor& p : before) values.push_back(p.to_vector<float>());
  model->to(Device::cpu(1));
  const std::vector<Tensor> after = model->parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(after[i].is_same(before[i])) << i;  // the same tensors, as optimizers hold them
    EXPECT_EQ(after[i].device(), Device::cpu(1)) << i;
    EXPECT_EQ(after[i].to_vector<float>(), values[i]) << i;
  }
}

TEST(Module, UnknownModelListsTheChoices) {
  try {
    make_model("vgg");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown model 'vgg': choose one of cnn, mlp, resnet"), std::string::npos)
        << e.what();
  }
}

TEST(Module, SequentialNamesChildrenByPosition) {
  Sequential seq{std::make_shared<Linear>(4, 3), std::make_shared<Sequential>(), std::make_shared<Linear>(3, 2, false)};
  EXPECT_EQ(names_of(seq.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias", "2.weight"}));
  std::vector<std::string> modules;
  for (const auto& entry : seq.named_modules()) modules.push_back(entry.first);
  EXPECT_EQ(modules, (std::vector<std::string>{"", "0", "1", "2"}));
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(seq[2]->type_name(), "Linear");
  EXPECT_THROW(seq[3], Error);
}

TEST(Module, StateDictPutsOwnBuffersBeforeChildren) {
  WithBuffer m;
  EXPECT_EQ(names_of(m.named_parameters()), (std::vector<std::string>{"scale", "shift", "inner.weight", "inner.bias"}));
  EXPECT_EQ(names_of(m.named_buffers()), (std::vector<std::string>{"count"}));
  // PyTorch: _save_to_state_dict writes _parameters then _buffers, then recurses.
  EXPECT_EQ(names_of(m.state_dict()),
            (std::vector<std::string>{"scale", "shift", "count", "inner.weight", "inner.bias"}));
  EXPECT_FALSE(m.count.requires_grad());
}

TEST(Module, TiedParameterIsListedOnceButSavedUnderBothNames) {
  Sequential seq{std::make_shared<Linear>(3, 3), std::make_shared<Linear>(3, 3)};
  auto second = std::static_pointer_cast<Linear>(seq[1]);
  auto tied = std::make_shared<Module>("Tied");
  tied->register_parameter("w", std::static_pointer_cast<Linear>(seq[0])->weight);
  seq.push_back(tied);
  EXPECT_EQ(names_of(seq.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
  EXPECT_EQ(names_of(seq.state_dict()), (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "2.w"}));
}

TEST(Module, RegistrationRejectsBadNames) {
  Module m("Custom");
  m.register_parameter("w", Tensor::zeros({2}));
  EXPECT_THROW(m.register_parameter("w", Tensor::zeros({2})), Error);
  EXPECT_THROW(m.register_buffer("w", Tensor::zeros({2})), Error);
  EXPECT_THROW(m.register_module("w", std::make_shared<Module>()), Error);
  EXPECT_THROW(m.register_parameter("a.b", Tensor::zeros({2})), Error);
  EXPECT_THROW(m.register_parameter("", Tensor::zeros({2})), Error);
  EXPECT_THROW(m.register_parameter("i", Tensor::zeros({2}, DType::i64)), Error);  // cannot require grad
  EXPECT_THROW(m.forward(Tensor::zeros({1})), Error);                              // a container
}

TEST(Module, LoadStateDictCopiesIntoTheExistingTensors) {
  const auto source = make_model("cnn", 1);
  const auto target = make_model("cnn", 2);
  const Tensor fc1 = std::static_pointer_cast<CNN>(target)->fc1->weight;
  const void* bytes_before = fc1.raw_data();
  EXPECT_NE(fc1.to_vector<float>(), std::static_pointer_cast<CNN>(source)->fc1->weight.to_vector<float>());
  target->load_state_dict(source->state_dict());
  EXPECT_EQ(fc1.raw_data(), bytes_before);  // same storage, no reallocation
  const NamedTensors a = source->state_dict(), b = target->state_dict();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>());
  EXPECT_TRUE(fc1.requires_grad());
  EXPECT_TRUE(fc1.is_leaf());
}

TEST(Module, LoadingItsOwnStateChangesNothing) {
  const auto model = make_model("mlp", 1);
  const std::vector<float> before = model->state_dict()[2].second.to_vector<float>();
  model->load_state_dict(model->state_dict());
  EXPECT_EQ(model->state_dict()[2].second.to_vector<float>(), before);
}

TEST(Module, LoadStateDictStripsTheDdpPrefix) {
  const auto source = make_model("mlp", 1);
  const auto target = make_model("mlp", 2);
  NamedTensors prefixed;
  for (const auto& [name, t] : source->state_dict()) prefixed.emplace_back("module." + name, t);
  target->load_state_dict(prefixed);
  EXPECT_EQ(target->state_dict()[4].second.to_vector<float>(), source->state_dict()[4].second.to_vector<float>());
}

// Names under another prefix than DDP's (a Lockstep checkpoint's "model.", a wrapper's):
// the error says which prefix to remove.
TEST(Module, StrictLoadNamesAPrefixTheStateHasAndTheModelLacks) {
  const auto model = make_model("mlp", 1);
  NamedTensors prefixed;
  for (const auto& [name, t] : make_model("mlp", 2)->state_dict()) prefixed.emplace_back("model." + name, t);
  try {
    model->load_state_dict(prefixed);
    ADD_FAILURE() << "prefixed names were loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("have the prefix 'model.' that this model's lack"), std::string::npos)
        << e.what();
  }
}

TEST(Module, StrictLoadNamesEveryMissingUnexpectedAndMisshapedKey) {
  const auto model = make_model("mlp", 3);
  const std::vector<float> before = model->state_dict()[1].second.to_vector<float>();
  NamedTensors state = make_model("mlp", 4)->state_dict();
  state.erase(state.begin() + 4, state.end());                 // drops fc3.weight, fc3.bias
  state[0].second = Tensor::zeros({512, 783});                 // fc1.weight misshaped
  state.emplace_back("fc4.weight", Tensor::zeros({10, 512}));  // unexpected
  const std::string message = error_of(*model, state);
  EXPECT_NE(message.find("Error(s) in loading state_dict for MLP"), std::string::npos) << message;
  EXPECT_NE(message.find("Missing key(s) in state_dict: \"fc3.weight\", \"fc3.bias\"."), std::string::npos) << message;
  EXPECT_NE(message.find("Unexpected key(s) in state_dict: \"fc4.weight\"."), std::string::npos) << message;
  EXPECT_NE(message.find("size mismatch for fc1.weight: copying a param with shape [512, 783] from checkpoint, the "
                         "shape in current model is [512, 784]."),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("\"fc1.weight\""), std::string::npos) << "a misshaped key is not also missing: " << message;
  // Nothing was copied, not even the keys that matched.
  EXPECT_EQ(model->state_dict()[1].second.to_vector<float>(), before);
}

TEST(Module, NonStrictLoadSkipsMissingAndUnexpectedButNotMisshaped) {
  const auto model = make_model("mlp", 3);
  const auto source = make_model("mlp", 4);
  NamedTensors state{source->state_dict()[1], {"extra", Tensor::zeros({1})}};
  EXPECT_EQ(error_of(*model, state, false), "");
  EXPECT_EQ(model->state_dict()[1].second.to_vector<float>(), source->state_dict()[1].second.to_vector<float>());
  state.emplace_back("fc2.bias", Tensor::zeros({3}));
  EXPECT_NE(error_of(*model, state, false).find("size mismatch for fc2.bias"), std::string::npos);
  // A duplicated key is ambiguous in either mode.
  EXPECT_NE(error_of(*model, {source->state_dict()[1], source->state_dict()[1]}, false).find("Duplicate key"),
            std::string::npos);
}

TEST(Module, TrainEvalAndZeroGradReachEveryDescendant) {
  Sequential seq{
      std::make_shared<Linear>(2, 2),
      std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{std::make_shared<Linear>(2, 2)})};
  seq.eval();
  for (const auto& entry : seq.named_modules()) EXPECT_FALSE(entry.second->is_training()) << entry.first;
  seq.train();
  for (const auto& entry : seq.named_modules()) EXPECT_TRUE(entry.second->is_training()) << entry.first;
  for (const Tensor& p : seq.parameters()) p.set_grad(Tensor::ones(p.shape()));
  seq.zero_grad();
  for (const Tensor& p : seq.parameters()) EXPECT_FALSE(p.grad().defined());
}

}  // namespace
}  // namespace lockstep::nn
