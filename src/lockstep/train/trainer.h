// The training loop as a library class: everything around the step that a run needs — the
// data order (one global order per (seed, epoch), dropped short batches), the learning-rate
// schedule, the progress bar, metrics.jsonl, a checkpoint at the end and exact resume from
// it, and summary.json with weights_sha256 — for a user's model, loss, dataset and optimizer
// on any parallel::Layout. A step is (seed, global batch, micro-batch): the result does not
// depend on the layout, the device count, or on a stop and a resume.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "lockstep/data/dataloader.h"
#include "lockstep/parallel/layout.h"

namespace lockstep::train {

struct TrainerOptions {
  int64_t batch_size = 32;  // samples per step, over every device
  int64_t epochs = 1;
  int64_t steps = -1;  // optimizer steps in all, counted from the run's start; -1: epochs' worth
  uint64_t seed = 0;   // data order and random layers (initialization is the model's own)
  double lr = 1e-3;
  std::string lr_schedule = "constant";  // optim/schedule.h: constant, step:N[:GAMMA], cosine[:warmup=N]...
  // Where metrics.jsonl, checkpoint.safetensors and summary.json go ("": nowhere). A
  // checkpoint found there is resumed from.
  std::string out_dir = "";
  int64_t log_every = 10;  // steps between metrics lines
  bool progress = true;    // the progress bar on stderr
  // Whether this process writes files and draws progress: under one process per device,
  // rank 0 only. Every process runs every step and collective either way.
  bool leader = true;
};

struct TrainSummary {
  int64_t steps = 0;         // taken in all, the resumed part included
  int64_t resumed_from = 0;  // the step the run started from (0, or a checkpoint's)
  double loss = 0;           // of the last step
  double seconds = 0;        // this run's training time
  double samples_per_second = 0;
  std::string weights_sha256;  // of layout.model()'s state_dict
};

class Trainer {
 public:
  Trainer(parallel::Layout& layout, std::shared_ptr<const Dataset> train_set, TrainerOptions options);

  // Runs to the last step; returns what it also writes to summary.json.
  TrainSummary fit();

  // Called after every step (extra metrics, early stopping by exception, ...).
  std::function<void(int64_t step, const Batch& batch, const parallel::StepResult& result)> on_step;

  static constexpr const char* kCheckpointFile = "checkpoint.safetensors";

 private:
  parallel::Layout& layout_;
  std::shared_ptr<const Dataset> train_set_;
  TrainerOptions options_;
};

// The mean of a per-sample loss (parallel/loss_function.h) over a dataset, in eval mode and
// without gradients, `batch` samples at a time on the model's device.
double evaluate_loss(nn::Module& model, const Dataset& data, const parallel::LossFunction& loss, int64_t batch = 256);

}  // namespace lockstep::train
