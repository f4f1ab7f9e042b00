// The library's training loop: the same weights_sha256 on 1 and 2 devices, files a run
// writes, an exact resume from its checkpoint (metrics appended), a checkpoint of another
// recipe refused by name, and evaluate_loss against a mean written out here.
#include "lockstep/train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/test_files.h"
#include "lockstep/io/checkpoint.h"
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
                        {"checkpoint-00000002.safetensors was made with batch_size 16, this run has 32"});
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

std::vector<std::string> checkpoint_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("checkpoint", 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Every 2 steps, the newest 2 kept, the latest a second name of the newest; a damaged newest
// one is skipped with a warning naming it, and the run resumed from the one before ends
// with the uninterrupted run's bits.
TEST(Trainer, CheckpointsWhileTrainingAndACorruptNewestIsSkipped) {
  TempDir dir;
  const auto data = regression_data();
  const auto straight = layout(1);
  const std::string whole = Trainer(*straight, data, recipe(dir.file("whole"), 12)).fit().weights_sha256;
  TrainerOptions options = recipe(dir.file("run"), 12);
  options.checkpoint_every = 2;
  const auto first = layout(2);
  const TrainSummary summary = Trainer(*first, data, options).fit();
  EXPECT_EQ(summary.checkpoints, 6);  // steps 2, 4, 6, 8, 10 and the end's
  EXPECT_EQ(checkpoint_files(dir.file("run")),
            (std::vector<std::string>{"checkpoint-00000010.safetensors", "checkpoint-00000012.safetensors",
                                      "checkpoint.safetensors"}));
  EXPECT_TRUE(std::filesystem::equivalent(dir.file("run/checkpoint.safetensors"),
                                          dir.file("run/checkpoint-00000012.safetensors")));

  // The newest save is cut short, as by a crash during a write of another kind.
  std::filesystem::resize_file(dir.file("run/checkpoint-00000012.safetensors"), 100);
  ::testing::internal::CaptureStderr();
  const auto resumed = layout(1);
  const TrainSummary again = Trainer(*resumed, data, options).fit();
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(again.resumed_from, 10);
  EXPECT_EQ(again.weights_sha256, whole);
  EXPECT_NE(warnings.find("skipping checkpoint " + dir.file("run/checkpoint-00000012.safetensors")), std::string::npos)
      << warnings;
}

// stop_at_step ends the run early with a checkpoint and the recipe unchanged; a signal
// stops it at the next step boundary. Either way the resumed run ends with the bits of one
// that never stopped.
TEST(Trainer, AStopAtAStepOrBySignalResumesToTheSameBits) {
  TempDir dir;
  const auto data = regression_data();
  const auto straight = layout(1);
  const std::string whole = Trainer(*straight, data, recipe(dir.file("whole"), 12)).fit().weights_sha256;

  TrainerOptions stopping = recipe(dir.file("stop"), 12);
  stopping.stop_at_step = 7;
  const auto first = layout(2);
  const TrainSummary stopped = Trainer(*first, data, stopping).fit();
  EXPECT_FALSE(stopped.finished);
  EXPECT_EQ(stopped.steps, 7);
  const auto second = layout(1);
  const TrainSummary rest = Trainer(*second, data, recipe(dir.file("stop"), 12)).fit();
  EXPECT_TRUE(rest.finished);
  EXPECT_EQ(rest.resumed_from, 7);
  EXPECT_EQ(rest.weights_sha256, whole);

  TrainerOptions signalled = recipe(dir.file("signal"), 12);
  signalled.stop_on_signals = true;
  const auto third = layout(2);
  Trainer trainer(*third, data, signalled);
  trainer.on_step = [](int64_t step, const Batch&, const parallel::StepResult&) {
    if (step == 4) std::raise(SIGTERM);  // the process would die of it without the trainer's handler
  };
  const TrainSummary interrupted = trainer.fit();
  EXPECT_EQ(interrupted.stop_signal, SIGTERM);
  EXPECT_EQ(interrupted.steps, 4);
  EXPECT_EQ(load_safetensors_metadata(dir.file("signal/checkpoint.safetensors")).at("step"), "4");
  const auto fourth = layout(1);
  EXPECT_EQ(Trainer(*fourth, data, recipe(dir.file("signal"), 12)).fit().weights_sha256, whole);
}

// A write that fails (here its temporary file's name is taken by a folder) stops the run
// with an error naming the file and the free space; the checkpoint before it is intact.
TEST(Trainer, AFailedWriteStopsTheRunAndKeepsThePreviousCheckpoint) {
  TempDir dir;
  const auto data = regression_data();
  TrainerOptions options = recipe(dir.file("run"), 12);
  options.checkpoint_every = 2;
  std::filesystem::create_directories(
      dir.file("run/checkpoint-00000004.safetensors.tmp." + std::to_string(::getpid())));
  const auto first = layout(1);
  testing::expect_error([&] { Trainer(*first, data, options).fit(); },
                        {"checkpoint-00000004.safetensors", "MiB free in", "the previous checkpoint is intact"});
  EXPECT_EQ(load_checkpoint(dir.file("run/checkpoint.safetensors")).metadata.at("step"), "2");
}

// A full disk under metrics.jsonl (here /dev/full) stops the run with one line that says so
// and names the checkpoint that is kept.
TEST(Trainer, AFullDiskUnderTheMetricsStopsTheRunNamingWhatIsKept) {
  TempDir dir;
  const auto data = regression_data();
  TrainerOptions options = recipe(dir.file("run"), 12);
  options.checkpoint_every = 2;
  options.log_every = 3;
  std::filesystem::create_directories(dir.file("run"));
  std::filesystem::create_symlink("/dev/full", dir.file("run/metrics.jsonl"));
  const auto dp = layout(1);
  testing::expect_error([&] { Trainer(*dp, data, options).fit(); },
                        {"metrics.jsonl", "the run stops at step 3, its checkpoint of step 2", "is intact"});
  EXPECT_EQ(load_checkpoint(dir.file("run/checkpoint.safetensors")).metadata.at("step"), "2");
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
