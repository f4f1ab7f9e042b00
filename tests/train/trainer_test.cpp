// The library's training loop: the same weights_sha256 on 1 and 2 devices, files a run
// writes, an exact resume from its checkpoint (metrics appended), a checkpoint of another
// recipe refused by name, and evaluate_loss against a mean written out here.
#include "lockstep/train/trainer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "io/test_files.h"
#include "lockstep/io/weights_sha256.h"
#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/parallel/data_parallel.h"

namespace lockstep::train {
namespace {

using testing::TempDir;

// y = 2·x0 - x1 + 0.5 and noise-free: 96 samples.
std::shared_ptr<TensorDataset> regression_data() {
  std::vector<float> x(96 * 2), y(96);
  for (size_t i = 0; i < 96; ++i) {
    x[2 * i] = static_cast<float>(i % 7) / 7.0f - 0.5f;
    x[2 * i + 1] = static_cast<float>(i % 5) / 5.0f - 0.5f;
    y[i] = 2 * x[2 * i] - x[2 * i + 1] + 0.5f;
  }
  return std::make_shared<TensorDataset>(
      TensorBatch{{"x", Tensor::from_vector(x, {96, 2})}, {"y", Tensor::from_vector(y, {96, 1})}});
}

std::unique_ptr<parallel::DataParallel> layout(int devices) {
  return std::make_unique<parallel::DataParallel>(
      parallel::DataParallelOptions{.loss = parallel::mse_loss("x", "y"), .devices = devices, .micro_batch = 4},
      [](int) {
        auto model = std::make_shared<nn::Linear>(2, 1);
        nn::initialize(*model, 3);
        return model;
      },
      [](std::vector<Tensor> params) {
        return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      });
}

TrainerOptions recipe(const std::string& out, int64_t steps) {
  return {.batch_size = 16,
          .steps = steps,
          .seed = 5,
          .lr = 0.2,
          .lr_schedule = "cosine:warmup=2:total=12",
          .out_dir = out,
          .log_every = 2,
          .progress = false};
}

int lines_of(const std::string& path) {
  std::ifstream in(path);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

TEST(Trainer, SameWeightsOnOneAndTwoDevicesAndTheFilesOfARun) {
  TempDir dir;
  const auto data = regression_data();
  const auto one = layout(1);
  const double before = evaluate_loss(one->model(), *data, parallel::mse_loss("x", "y"));
  const TrainSummary first = Trainer(*one, data, recipe(dir.file("one"), 12)).fit();
  const auto two = layout(2);
  const TrainSummary second = Trainer(*two, data, recipe(dir.file("two"), 12)).fit();
  EXPECT_EQ(first.steps, 12);
  EXPECT_EQ(first.weights_sha256, second.weights_sha256);
  EXPECT_EQ(first.weights_sha256.size(), 64u);
  EXPECT_LT(evaluate_loss(one->model(), *data, parallel::mse_loss("x", "y")), before / 4) << "the line is being learnt";
  EXPECT_EQ(lines_of(dir.file("one/metrics.jsonl")), 6);
  std::ifstream in(dir.file("one/summary.json"));
  const nlohmann::json summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary["weights_sha256"], first.weights_sha256);
  EXPECT_EQ(summary["steps"], 12);
  EXPECT_TRUE(std::filesystem::exists(dir.file("one/checkpoint.safetensors")));
}

TEST(Trainer, AStoppedRunResumesFromItsCheckpointWithTheSameBits) {
  TempDir dir;
  const auto data = regression_data();
  const auto straight = layout(1);
  const std::string whole = Trainer(*straight, data, recipe(dir.file("whole"), 12)).fit().weights_sha256;
  const auto first = layout(2);
  EXPECT_EQ(Trainer(*first, data, recipe(dir.file("split"), 5)).fit().steps, 5);  // crosses no epoch: 6 a epoch
  const auto second = layout(1);                                                  // resumed on another device count
  const TrainSummary resumed = Trainer(*second, data, recipe(dir.file("split"), 12)).fit();
  EXPECT_EQ(resumed.resumed_from, 5);
  EXPECT_EQ(resumed.steps, 12);
  EXPECT_EQ(resumed.weights_sha256, whole);
  EXPECT_EQ(lines_of(dir.file("split/metrics.jsonl")), 3 + 4);  // steps 2, 4, 5, then 6, 8, 10, 12
}

TEST(Trainer, ACheckpointOfAnotherRecipeIsRefusedByName) {
  TempDir dir;
  const auto data = regression_data();
  const auto first = layout(1);
  Trainer(*first, data, recipe(dir.file("run"), 2)).fit();
  TrainerOptions other = recipe(dir.file("run"), 4);
  other.batch_size = 32;
  const auto second = layout(1);
  testing::expect_error([&] { Trainer(*second, data, other).fit(); },
                        {"checkpoint.safetensors was made with batch_size 16, this run has 32"});
}

// What a program adds: its recipe in the checkpoint, fields in the metrics, and the hooks
// called at the start, after each step and after training; the model it may use alone.
TEST(Trainer, KeepsTheRecipeAndCallsTheHooks) {
  TempDir dir;
  const auto data = regression_data();
  const auto dp = layout(2);
  TrainerOptions options = recipe(dir.file("run"), 12);
  options.recipe = {{"model", "linear-2-1"}};
  Trainer trainer(*dp, data, options);
  std::vector<int64_t> started, stepped;
  int trained = 0;
  trainer.on_start = [&](int64_t first, int64_t total) { started = {first, total}; };
  trainer.on_step = [&](int64_t step, const Batch&, const parallel::StepResult&) { stepped.push_back(step); };
  trainer.on_metrics = [](nlohmann::json& line, const parallel::StepResult& result) {
    line["devices"] = result.devices.size();
  };
  trainer.on_trained = [&] { ++trained; };
  const TrainSummary summary = trainer.fit();
  EXPECT_EQ(started, (std::vector<int64_t>{0, 12}));
  EXPECT_EQ(stepped.size(), 12u);
  EXPECT_EQ(stepped.back(), 12);
  EXPECT_EQ(trained, 1);
  EXPECT_EQ(summary.samples, 12 * 16);
  EXPECT_EQ(weights_sha256(trainer.trained_model()), summary.weights_sha256);
  const Metadata saved = load_safetensors_metadata(dir.file("run/checkpoint.safetensors"));
  EXPECT_EQ(saved.at("model"), "linear-2-1");
  EXPECT_EQ(saved.at("step"), "12");
  std::ifstream metrics(dir.file("run/metrics.jsonl"));
  std::string first_line;
  std::getline(metrics, first_line);
  EXPECT_EQ(nlohmann::json::parse(first_line)["devices"], 2);

  TrainerOptions reserved = options;
  reserved.recipe["step"] = "3";
  testing::expect_error([&] { Trainer(*dp, data, reserved); }, {"the recipe may not set 'step'"});
}

// resume "none" starts afresh over a folder's checkpoint; a path resumes from that file
// into another folder.
TEST(Trainer, ResumeNamesTheCheckpointOrNone) {
  TempDir dir;
  const auto data = regression_data();
  const auto whole = layout(1);
  const std::string straight = Trainer(*whole, data, recipe(dir.file("whole"), 12)).fit().weights_sha256;
  const auto first = layout(1);
  Trainer(*first, data, recipe(dir.file("a"), 5)).fit();

  TrainerOptions elsewhere = recipe(dir.file("b"), 12);
  elsewhere.resume = dir.file("a/checkpoint.safetensors");
  const auto second = layout(1);
  const TrainSummary resumed = Trainer(*second, data, elsewhere).fit();
  EXPECT_EQ(resumed.resumed_from, 5);
  EXPECT_EQ(resumed.weights_sha256, straight);

  TrainerOptions afresh = recipe(dir.file("a"), 12);
  afresh.resume = "none";
  const auto third = layout(1);
  const TrainSummary fresh = Trainer(*third, data, afresh).fit();
  EXPECT_EQ(fresh.resumed_from, 0);
  EXPECT_EQ(fresh.weights_sha256, straight);
  EXPECT_EQ(lines_of(dir.file("a/metrics.jsonl")), 6) << "a fresh start writes its metrics anew";
}

TEST(Trainer, EvaluateLossIsTheMeanOverEveryTerm) {
  const auto data = regression_data();
  auto model = std::make_shared<nn::Linear>(2, 1);
  nn::initialize(*model, 3);
  double expected = 0;
  const std::vector<float> x = (*data)["x"].to_vector<float>(), y = (*data)["y"].to_vector<float>();
  const std::vector<float> w = model->weight.to_vector<float>(), b = model->bias.to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) {
    const double prediction = double{w[0]} * x[2 * i] + double{w[1]} * x[2 * i + 1] + b[0];
    expected += (prediction - y[i]) * (prediction - y[i]) / static_cast<double>(y.size());
  }
  EXPECT_NEAR(evaluate_loss(*model, *data, parallel::mse_loss("x", "y"), 40), expected, 1e-6);
  EXPECT_TRUE(model->is_training());  // left as it was
}

}  // namespace
}  // namespace lockstep::train
