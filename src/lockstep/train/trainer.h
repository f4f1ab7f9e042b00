// The training loop as a library class: everything around the step that a run needs — the
// data order (one global order per (seed, epoch), dropped short batches), the learning-rate
// schedule, the progress bar, metrics.jsonl, checkpoints while training (written in the
// background) and at the end, exact resume from the newest one that is intact, a stop at a
// step boundary on SIGTERM/SIGINT/SIGUSR1, and summary.json with weights_sha256 — for a
// user's model, loss, dataset and optimizer on any parallel::Layout. A step is (seed, global
// batch, micro-batch): the result does not depend on the layout, the device count, or on a
// stop and a resume. A program adds its own
// reports through the hooks (`lockstep train` adds its per-device table and memory).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/data/dataloader.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/obs/progress.h"
#include "lockstep/parallel/layout.h"
#include "lockstep/train/checkpoint_folder.h"
#include "lockstep/train/checkpoint_writer.h"

namespace lockstep::train {

struct TrainerOptions {
  int64_t batch_size = 32;  // samples per step, over every device
  int64_t epochs = 1;
  int64_t steps = -1;  // optimizer steps in all, counted from the run's start; -1: epochs' worth
  uint64_t seed = 0;   // data order and random layers (initialization is the model's own)
  double lr = 1e-3;
  std::string lr_schedule = "constant";  // optim/schedule.h: constant, step:N[:GAMMA], cosine[:warmup=N]...
  // Where metrics.jsonl, the checkpoints (checkpoint_folder.h) and summary.json go ("":
  // nowhere); the same on every process.
  std::string out_dir = "";
  // The checkpoint the run continues from: "auto" (out_dir's newest intact one, when it has
  // one), "none" (start afresh), a checkpoint file, or a folder (its newest intact one).
  std::string resume = "auto";
  // Checkpoints while training, into out_dir: every N steps (0: none), and every so many
  // seconds of training (0: none; the leader's clock decides for every process). The
  // newest `keep_checkpoints` stay. A checkpoint is always written at the end. Where the
  // layout's replicas disagree after a step (local SGD between averagings: layout.h), a
  // checkpoint or a stop due then waits for the next step where they agree.
  int64_t checkpoint_every = 0;
  double checkpoint_interval_seconds = 0;
  int keep_checkpoints = 2;
  // Ends the run after this step of the whole run (-1: at the end), with a checkpoint; the
  // recipe stays as it was, so a resume continues as if the run had not stopped.
  int64_t stop_at_step = -1;
  // SIGTERM, SIGINT and SIGUSR1 stop the run at the next step boundary, agreed by every
  // process, with a checkpoint (stop_signals.h); a second signal stops at once.
  bool stop_on_signals = false;
  // What the program needs to rebuild the run (its model's name and shape, its settings),
  // saved in the checkpoint's metadata beside the trainer's own keys (step, epoch, sample,
  // seed, batch_size), which it may not use.
  Metadata recipe = {};
  bool write_summary = true;  // summary.json (a program writing a fuller one turns it off)
  int64_t log_every = 10;     // steps between metrics lines
  bool progress = true;       // the progress bar on stderr
  // A step that runs out of device memory (OutOfMemoryError) is taken again with half the
  // micro-batch, the global batch unchanged, for as long as the layout accepts one
  // (parallel/layout.h: DataParallel does; layouts across processes do not, and the run
  // fails with the error). The micro-batch is part of the result, so each change is
  // printed, kept in the summary and in later checkpoints, which resume with it. Off: the
  // error ends the run.
  bool halve_micro_batch_on_out_of_memory = false;
  // Whether this process writes files and draws progress: under one process per device,
  // rank 0 only (the sharded state is assembled on process 0 for it). Every process runs
  // every step and collective either way.
  bool leader = true;
};

// A step taken again with a smaller micro-batch (halve_micro_batch_on_out_of_memory).
struct MicroBatchChange {
  int64_t step = 0;  // the step, numbered from 1, that ran out of memory
  int64_t from = 0;
  int64_t to = 0;
  std::string error;  // what ran out
};

struct TrainSummary {
  int64_t steps = 0;         // taken in all, the resumed part included
  int64_t resumed_from = 0;  // the step the run started from (0, or a checkpoint's)
  int64_t samples = 0;       // trained on in this run
  LoaderPosition position;   // of the data order after the last step
  double loss = 0;           // of the last step
  double seconds = 0;        // this run's training time
  double samples_per_second = 0;
  std::string weights_sha256;  // of layout.model()'s state_dict
  // Whether it reached the last step; if not, what stopped it (stop_at_step, or a signal).
  bool finished = false;
  int stop_signal = 0;     // the signal, when one stopped it (on any process)
  std::string checkpoint;  // the last checkpoint written ("" without out_dir)
  // Checkpoints written, the time training was held for them (assembling and copying the
  // state at the step boundary, and waiting for a write still in flight; not the wait for
  // the last write after the last step) and the time spent writing them in the background.
  int64_t checkpoints = 0;
  double checkpoint_hold_seconds = 0;
  double checkpoint_write_seconds = 0;
  std::vector<MicroBatchChange> micro_batch_changes;  // in this run, in order
  int64_t micro_batch = 0;                            // the layout's at the end (0: it does not say)
};

class Trainer {
 public:
  Trainer(parallel::Layout& layout, std::shared_ptr<const Dataset> train_set, TrainerOptions options);

  // Runs to the last step; returns what it also writes to summary.json.
  TrainSummary fit();
  // The full model fit() assembled at its end, to evaluate or save. Unlike layout.model(),
  // which is collective where the model is sharded across processes, any process may use it
  // alone. Valid until the layout's next step.
  nn::Module& trained_model() const;

  // The hooks, all optional. Before the first step, once the run's extent is known:
  std::function<void(int64_t first_step, int64_t total_steps)> on_start;
  // After every step (extra reports, early stopping by exception, ...):
  std::function<void(int64_t step, const Batch& batch, const parallel::StepResult& result)> on_step;
  // With each metrics.jsonl line before it is written, to add fields:
  std::function<void(nlohmann::json& line, const parallel::StepResult& result)> on_metrics;
  // When a step is taken again with a smaller micro-batch (the leader prints a line on
  // stderr without one):
  std::function<void(const MicroBatchChange& change)> on_micro_batch_change;
  // After the last step, before the checkpoint is assembled and written:
  std::function<void()> on_trained;

  static constexpr const char* kCheckpointFile = CheckpointFolder::kLatestFile;

 private:
  // Assembles the state (collective), and on the leader hands a copy of it to the writer.
  TrainSummary run_fit();
  // layout_.step, taken again with half the micro-batch while it runs out of memory and
  // the options and the layout allow.
  parallel::StepResult step_layout(const TensorBatch& samples, const parallel::StepContext& context,
                                   TrainSummary& summary, ProgressBar& progress);
  // A checkpoint at `step`; the last one (the end's, or a stop's) also assembles the model
  // trained_model() gives on every rank.
  void save(int64_t step, const LoaderPosition& position, TrainSummary& summary, bool last);

  parallel::Layout& layout_;
  std::shared_ptr<const Dataset> train_set_;
  TrainerOptions options_;
  nn::Module* trained_ = nullptr;
  std::unique_ptr<CheckpointWriter> writer_;  // the leader's, with out_dir
  int64_t saved_step_ = -1;                   // of the last checkpoint handed to it
};

// summary.json's "micro_batch" (where the layout says it) and "micro_batch_changes" (each
// {step, from, to, error}), for a program that writes its own summary.
void add_micro_batch(nlohmann::json& json, const TrainSummary& summary);

// The mean of a per-sample loss (parallel/loss_function.h) over a dataset, in eval mode and
// without gradients, `batch` samples at a time on the model's device.
double evaluate_loss(nn::Module& model, const Dataset& data, const parallel::LossFunction& loss, int64_t batch = 256);

}  // namespace lockstep::train
