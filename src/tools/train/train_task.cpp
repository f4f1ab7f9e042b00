#include "tools/train/train_task.h"

#include "lockstep/core/error.h"
#include "lockstep/data/fashion_mnist.h"
#include "lockstep/data/text_dataset.h"
#include "lockstep/nn/models.h"

namespace lockstep::tools {

TrainTask make_train_task(const TrainPlan& plan) {
  const TrainOptions& options = plan.settings;
  TrainTask task;
  if (options.model == "gpt") {
    task.language_model = true;
    task.gpt = plan.gpt;
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
  const std::string dir = options.data_dir.empty() ? kFashionMnistDefaultDir : options.data_dir;
  task.train = std::make_shared<TensorDataset>(load_fashion_mnist(dir, Split::train));
  task.test = std::make_shared<TensorDataset>(load_fashion_mnist(dir, Split::test));
  LOCKSTEP_CHECK(task.train->size() > 0) << "the training set in " << dir << " is empty";
  LOCKSTEP_CHECK(task.test->size() > 0) << "the test set in " << dir << " is empty: there is nothing to measure "
                                        << "the accuracy on (t10k-images-idx3-ubyte.gz holds no image)";
  task.test_name = "test";
  const std::string name = options.model;
  const uint64_t seed = options.seed;
  task.make_model = [name, seed] { return nn::make_model(name, seed); };
  task.input = kImageField;
  task.target = kLabelField;
  task.loss = parallel::classification_loss(task.input, task.target, options.label_smoothing);
  return task;
}

}  // namespace lockstep::tools
