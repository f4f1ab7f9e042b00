// What `lockstep train` trains on what: a Fashion-MNIST classifier (`--model cnn|mlp`) or a
// GPT over byte-level text (`--model gpt`, `--data FILE` or the fortunes). Both reach the
// training loop the same way — a Dataset of inputs and targets and a model factory — so
// every strategy and the step's tree treat them alike.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "lockstep/data/dataset.h"
#include "lockstep/nn/gpt.h"
#include "lockstep/nn/module.h"
#include "lockstep/parallel/loss_function.h"
#include "tools/train/train_plan.h"

namespace lockstep::tools {

struct TrainTask {
  std::shared_ptr<const TensorDataset> train;
  std::shared_ptr<const TensorDataset> test;  // Fashion-MNIST's test split, or the text's validation windows
  std::string test_name;                      // "test" or "validation", for the report
  bool language_model = false;
  nn::GptConfig gpt;                                        // with language_model
  std::function<std::shared_ptr<nn::Module>()> make_model;  // initialized from options.seed
  // The fields the model reads and predicts ("image" and "label", or "tokens" and
  // "targets"), and the loss over them.
  std::string input, target;
  parallel::LossFunction loss;
};

// Loads the plan's data and makes its model factory.
TrainTask make_train_task(const TrainPlan& plan);

}  // namespace lockstep::tools
