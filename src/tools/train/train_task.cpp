#include "tools/train/train_task.h"

#include <algorithm>

#include "lockstep/core/error.h"
#include "lockstep/data/fashion_mnist.h"
#include "lockstep/data/text_dataset.h"
#include "lockstep/nn/models.h"

namespace lockstep::tools {
namespace {

nn::GptConfig gpt_config(const TrainOptions& options) {
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--layers", options.layers},
                                    {"--heads", options.heads},
                                    {"--width", options.width},
                                    {"--context", options.context}}) {
    if (value < 0) {
      throw UsageError(std::string(flag) + " must be positive (leave it out for the preset's), got " +
                       std::to_string(value));
    }
  }
  if (options.sample_bytes < 0)
    throw UsageError("--sample must be 0 or more bytes, got " + std::to_string(options.sample_bytes));
  if (!(options.temperature >= 0)) {
    throw UsageError("--temperature must be 0 (greedy) or more, got " + std::to_string(options.temperature));
  }
  nn::GptConfig config;
  try {
    config = nn::gpt_preset(options.preset);
  } catch (const Error& e) {
    throw UsageError(std::string("--preset: ") + e.what());
  }
  if (options.layers > 0) config.layers = options.layers;
  if (options.heads > 0) config.heads = options.heads;
  if (options.width > 0) config.width = options.width;
  if (options.context > 0) config.context = options.context;
  try {
    nn::check_gpt_config(config);
  } catch (const Error& e) {
    throw UsageError(std::string("--model gpt: ") + e.what() + " (set by --preset, --layers, --heads, --width)");
  }
  return config;
}

}  // namespace

TrainTask make_train_task(const TrainOptions& options) {
  TrainTask task;
  if (options.model == "gpt") {
    task.language_model = true;
    task.gpt = gpt_config(options);
    const TextSplits text = load_text(options.data_dir);
    task.train = std::make_shared<TensorDataset>(text_windows(text.train, task.gpt.context));
    task.test = std::make_shared<TensorDataset>(text_windows(text.validation, task.gpt.context));
    task.test_name = "validation";
    task.input = kTokensField;
    task.target = kTargetsField;
    task.loss = parallel::next_token_loss(task.input, task.target);
    const nn::GptConfig config = task.gpt;
    const uint64_t seed = options.seed;
    const bool checkpoint = options.checkpoint_activations;
    task.make_model = [config, seed, checkpoint] {
      auto model = std::make_shared<nn::Gpt>(config, seed);
      model->checkpoint_activations = checkpoint;
      return model;
    };
    return task;
  }
  const std::vector<std::string> images = nn::model_names();
  if (std::find(images.begin(), images.end(), options.model) == images.end()) {
    throw UsageError("--model must be cnn, mlp, resnet (Fashion-MNIST) or gpt (text), got '" + options.model + "'");
  }
  const std::string dir = options.data_dir.empty() ? kFashionMnistDefaultDir : options.data_dir;
  task.train = std::make_shared<TensorDataset>(load_fashion_mnist(dir, Split::train));
  task.test = std::make_shared<TensorDataset>(load_fashion_mnist(dir, Split::test));
  LOCKSTEP_CHECK(task.train->size() > 0) << "the training set in " << dir << " is empty";
  task.test_name = "test";
  const std::string name = options.model;
  const uint64_t seed = options.seed;
  task.make_model = [name, seed] { return nn::make_model(name, seed); };
  task.input = kImageField;
  task.target = kLabelField;
  task.loss = parallel::classification_loss(task.input, task.target);
  return task;
}

}  // namespace lockstep::tools
